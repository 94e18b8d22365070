-- :checkhealth kspec — the Neovim features found, the server command, the engine status.
local M = {}

local health = vim.health

local function yes(b)
  return b and 'yes' or 'no'
end

function M.check()
  local kspec = require('kspec')
  local server = require('kspec.server')
  local status = require('kspec.status')

  health.start('kspec: Neovim')
  local v = vim.version()
  local version = ('%d.%d.%d'):format(v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.10') == 1 then
    health.ok('Neovim ' .. version)
  else
    health.error('Neovim ' .. version .. ': kspec needs 0.10 or newer')
  end
  local has_config = vim.lsp.config ~= nil and vim.fn.has('nvim-0.11') == 1
  local has_inline = vim.lsp.inline_completion ~= nil and type(vim.lsp.inline_completion.enable) == 'function'
  health.info('vim.lsp.config / vim.lsp.enable (0.11+): ' .. yes(has_config))
  health.info('vim.lsp.inline_completion (0.12+): ' .. yes(has_inline))
  health.info('inline virtual text (0.10+): ' .. yes(vim.fn.has('nvim-0.10') == 1))
  if not kspec.opts then
    health.warn('require("kspec").setup() has not been called', { 'Call it from your init.lua' })
    return
  end
  local display = kspec.display()
  health.ok('completions are shown by ' .. (display == 'builtin' and 'vim.lsp.inline_completion' or 'kspec ghost text'))
  for _, p in ipairs(kspec.problems) do
    health.warn('setup(): ' .. p)
  end

  health.start('kspec: server')
  local root = vim.fs.root and vim.fs.root(0, kspec.opts.root_markers) or nil
  root = root or vim.fn.getcwd()
  local cmd, where = server.find(root, kspec.opts)
  local startable = cmd ~= nil
  if cmd then
    health.ok(('server command: %s (%s)'):format(table.concat(cmd, ' '), where))
    if vim.fn.executable(cmd[1]) ~= 1 then
      health.error(cmd[1] .. ' is not executable')
      startable = false
    end
  else
    health.error(where)
  end
  if kspec.missing and kspec.missing ~= where then
    health.error('a buffer found no server: ' .. kspec.missing)
  end
  health.info('settings sent: ' .. vim.inspect(kspec.opts.settings, { newline = ' ', indent = '' }))
  health.info('completions: ' .. (kspec.is_enabled() and 'on' or 'off (:KspecToggle)'))

  local clients = kspec.clients()
  if #clients == 0 then
    if startable then
      health.info('no kspec server is running (open a file to start one)')
    else
      health.warn('no kspec server is running: it cannot start until kspec is found (see above)')
    end
    return
  end
  for _, client in ipairs(clients) do
    local caps = client.server_capabilities or {}
    local s = status.by_client[client.id]
    -- kspec lsp says its pid in its status (Neovim's client keeps none since 0.11)
    local pid = s and s.serverPid or (client.rpc and client.rpc.pid)
    health.ok(('client %d: kspec lsp %s, position encoding %s, inline completion %s'):format(
      client.id,
      pid and ('pid ' .. math.floor(pid)) or '(pid not reported yet)',
      tostring(client.offset_encoding),
      yes(caps.inlineCompletionProvider ~= nil and caps.inlineCompletionProvider ~= false)
    ))
    if not s then
      health.info('engine: no status received yet')
    else
      local line = ('engine: %s%s%s%s%s'):format(
        s.state,
        s.model and (' (model ' .. s.model .. ')') or '',
        s.message ~= '' and (' — ' .. s.message) or '',
        s.progress and (' (%d%%)'):format(math.floor(s.progress * 100 + 0.5)) or '',
        s.lastLatencyMs and (', last completion %d ms'):format(math.floor(s.lastLatencyMs + 0.5)) or ''
      )
      if s.enginePid then
        line = line .. (', engine daemon pid %d'):format(s.enginePid)
      end
      if s.decoding and #s.decoding > 0 then
        line = line .. ', decoding for ' .. table.concat(s.decoding, ', ')
      elseif s.activity == 'busy' then
        line = line .. ', a request is with the engine'
      elseif s.activity == 'timedOut' then
        line = line .. ', the last request timed out (deadlineMs)'
      end
      line = line .. status.alternatives_note(s)
      if s.state == 'error' then
        health.error(line, { 'See :KspecLog', 'Restart with :KspecRestart' })
      elseif s.state == 'loading' then
        health.info(line)
      else
        health.ok(line)
      end
    end
  end
  local logs = kspec.logs()
  health.info('logs (:KspecLog): ' .. (logs.engine and ('engine daemon ' .. logs.engine .. ', ') or '') .. 'kspec lsp stderr in ' .. logs.lsp)
end

return M
