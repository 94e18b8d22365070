-- The engine's state from `$/kspec/status` notifications, for the statusline,
-- :KspecStatus and :checkhealth kspec.
local M = {}

M.METHOD = '$/kspec/status'

--- client_id -> { state, message, progress, lastLatencyMs, activity, decoding, alternatives, ... }
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
  local decoding = {}
  if type(params.decoding) == 'table' then
    for _, uri in ipairs(params.decoding) do
      if type(uri) == 'string' and uri ~= '' then
        decoding[#decoding + 1] = uri
      end
    end
  end
  local alternatives = nil
  local alt = params.alternatives
  if type(alt) == 'table' and num(alt.count) and num(alt.k) then
    alternatives = { count = math.floor(alt.count), k = math.floor(alt.k) }
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
    decoding = decoding, -- the documents (URIs) whose engine work runs now: busy while any does
    alternatives = alternatives, -- the last final answer: { count (distinct), k (asked for) }
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

--- Does the server (client `client_id`) say it decodes for document `uri` now? A final
--- `$/kspec/suggestionsUpdated` for it (finished) says it is done until the next status.
function M.is_decoding(client_id, uri)
  local s = M.by_client[client_id]
  return s ~= nil and s.decoding ~= nil and vim.tbl_contains(s.decoding, uri)
end

--- A final `$/kspec/suggestionsUpdated` for `uri`: its alternatives are final now.
function M.finished(client_id, uri)
  local s = M.by_client[client_id]
  if s and s.decoding then
    s.decoding = vim.tbl_filter(function(u)
      return u ~= uri
    end, s.decoding)
  end
end

--- "; last answer: 2 distinct alternatives of k = 3" when the last final answer had fewer
--- distinct alternatives than k (the others were the same text), else ''.
function M.alternatives_note(s)
  local alt = s and s.alternatives
  if not alt or alt.count >= alt.k then
    return ''
  end
  return ('; last answer: %d distinct alternative%s of k = %d (the others were the same text)'):format(alt.count, alt.count == 1 and '' or 's', alt.k)
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
--- answer's latency), "kspec busy" (a request is with the engine, or the engine still decodes
--- for a document after an early answer: idle only when nothing does), "kspec timed out" (the
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
  if s.activity == 'busy' or (s.decoding ~= nil and #s.decoding > 0) then
    return 'kspec busy'
  elseif s.activity == 'timedOut' then
    return 'kspec timed out'
  end
  return s.lastLatencyMs and ('kspec ' .. ms(s.lastLatencyMs)) or 'kspec'
end

return M
