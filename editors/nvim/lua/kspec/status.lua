-- The engine's state from `$/kspec/status` notifications, for the statusline,
-- :KspecStatus and :checkhealth kspec.
local M = {}

M.METHOD = '$/kspec/status'

--- client_id -> { state, message, progress, lastLatencyMs }
M.by_client = {}
M.notify_errors = false
local last_notified = {}

local function num(v)
  return type(v) == 'number' and v == v and v ~= math.huge and v ~= -math.huge and v or nil
end

--- Validate params; nil when malformed. The latency is `lastLatencyMs` in DESIGN.md §3;
--- kspec lsp sends `latencyMs` (of the last answered request): both are read.
function M.parse(params)
  if type(params) ~= 'table' then
    return nil
  end
  local state = params.state
  if state ~= 'loading' and state ~= 'ready' and state ~= 'error' then
    return nil
  end
  local activity = params.activity
  if activity ~= 'busy' and activity ~= 'timedOut' then
    activity = nil -- 'idle', absent or unknown
  end
  return {
    state = state,
    message = type(params.message) == 'string' and params.message or '',
    progress = num(params.progress),
    lastLatencyMs = num(params.lastLatencyMs) or num(params.latencyMs),
    model = type(params.model) == 'string' and params.model ~= '' and params.model or nil,
    activity = activity, -- 'busy': a request is with the engine; 'timedOut': the last one got nothing by its deadline
    serverPid = num(params.serverPid),
    enginePid = num(params.enginePid),
    logFile = type(params.logFile) == 'string' and params.logFile ~= '' and params.logFile or nil, -- the engine daemon's log
  }
end

--- Redraw every statusline now: a status arrives between keystrokes, and a statusline
--- is otherwise redrawn only when something else is.
local function redraw()
  pcall(vim.cmd, 'redrawstatus!')
  vim.api.nvim_exec_autocmds('User', { pattern = 'KspecStatus', modeline = false })
end
M.redraw = redraw

--- LSP notification handler (vim.lsp.Config.handlers['$/kspec/status']).
function M.handler(_, params, ctx)
  local s = M.parse(params)
  if not s or not ctx then
    return
  end
  local prev = M.by_client[ctx.client_id]
  if s.lastLatencyMs == nil and prev and s.state == 'ready' then
    s.lastLatencyMs = prev.lastLatencyMs -- keep the last one seen
  end
  M.by_client[ctx.client_id] = s
  if s.state == 'error' then
    if M.notify_errors and last_notified[ctx.client_id] ~= s.message then
      last_notified[ctx.client_id] = s.message
      vim.schedule(function()
        vim.notify('kspec: ' .. (s.message ~= '' and s.message or 'engine error') .. ' (:checkhealth kspec, :KspecLog)', vim.log.levels.ERROR)
      end)
    end
  else
    last_notified[ctx.client_id] = nil
  end
  vim.schedule(redraw)
end

function M.forget(client_id)
  M.by_client[client_id] = nil
  last_notified[client_id] = nil
  vim.schedule(redraw)
end

--- The status of the first kspec client with one, or nil.
function M.current()
  local ids = vim.tbl_keys(M.by_client)
  table.sort(ids)
  return ids[1] and M.by_client[ids[1]] or nil
end

local function ms(v)
  if v >= 10000 then
    return ('%.1fs'):format(v / 1000)
  end
  return ('%dms'):format(math.floor(v + 0.5))
end

--- One short string for a statusline: "kspec 42%" (loading), "kspec 85ms" (ready: the last
--- answer's latency), "kspec busy" (a request is with the engine), "kspec timed out" (the
--- last request got nothing by its deadline), "kspec error", "kspec off".
--- @param enabled boolean|nil
function M.text(s, enabled)
  if s and s.state == 'error' then
    return 'kspec error'
  end
  if enabled == false then
    return 'kspec off'
  end
  if not s then
    return 'kspec …'
  end
  if s.state == 'loading' then
    if s.progress then
      return ('kspec %d%%'):format(math.floor(math.min(1, math.max(0, s.progress)) * 100 + 0.5))
    end
    return 'kspec …'
  end
  if s.activity == 'busy' then
    return 'kspec busy'
  elseif s.activity == 'timedOut' then
    return 'kspec timed out'
  end
  return s.lastLatencyMs and ('kspec ' .. ms(s.lastLatencyMs)) or 'kspec'
end

return M
