-- kspec for Neovim: registers `kspec lsp` and shows its k inline completions.
--
--   require('kspec').setup({ settings = { model = '~/models/qwen2.5-coder-1.5b', k = 4 } })
--
-- 0.11+: vim.lsp.config / vim.lsp.enable; 0.10: vim.lsp.start on FileType.
-- 0.12+: completions through vim.lsp.inline_completion; before: ghost text (kspec.ghost).
local config = require('kspec.config')
local ghost = require('kspec.ghost')
local server = require('kspec.server')
local status = require('kspec.status')

local M = {}

local api = vim.api
local NAME = 'kspec'

--- Resolved options after setup(); nil before.
M.opts = nil
--- Problems found in the options given to setup() (also shown once with vim.notify).
M.problems = {}
--- Why the server could not be started (no `kspec` found), once found out; nil otherwise.
M.missing = nil

--- No `kspec` to start: say so once, outside the autocommand that found out (an error
--- message inside FileType / BufReadPost aborts that buffer's other autocommands, its
--- syntax highlighting among them, and asks for ENTER). :checkhealth kspec has the details.
local function report_missing(where)
  if M.missing ~= nil then
    return
  end
  M.missing = where
  vim.schedule(function()
    vim.notify('kspec: no `kspec` command found; completions are off (:checkhealth kspec)', vim.log.levels.WARN)
  end)
end

local function has(feature)
  return vim.fn.has(feature) == 1
end

--- Which display is used: 'builtin' (vim.lsp.inline_completion) or 'plugin' (ghost text).
function M.display()
  local opts = M.opts or config.defaults
  local builtin = vim.lsp.inline_completion ~= nil and type(vim.lsp.inline_completion.enable) == 'function'
  if opts.inline == 'plugin' or not builtin then
    return 'plugin'
  end
  return 'builtin'
end

function M.clients(bufnr)
  return vim.lsp.get_clients({ name = NAME, bufnr = bufnr })
end

local function is_enabled()
  return M.opts ~= nil and config.enabled(M.opts)
end

local function root_of(bufnr)
  local name = api.nvim_buf_get_name(bufnr)
  local root = (vim.fs.root and name ~= '') and vim.fs.root(bufnr, M.opts.root_markers) or nil
  return root or vim.fn.getcwd()
end

-- Key handling -------------------------------------------------------------------

local function cmd(fn)
  return ('<Cmd>lua require("kspec")._key(%q)<CR>'):format(fn)
end

--- Called from the mappings' <Cmd> (not from an expr, so the buffer may change).
function M._key(action)
  local bufnr = api.nvim_get_current_buf()
  if M.display() == 'builtin' then
    local ic = vim.lsp.inline_completion
    if action == 'next' or action == 'prev' then
      ic.select({ bufnr = bufnr, count = action == 'next' and 1 or -1 })
    elseif action == 'dismiss' then
      -- no dismiss in the API: turning it off and on again aborts and hides
      ic.enable(false, { bufnr = bufnr })
      ic.enable(is_enabled(), { bufnr = bufnr })
      ghost.mark_dismissed(bufnr) -- no update shows it again here
    end
    return
  end
  if action == 'accept' then
    ghost.accept(bufnr)
  elseif action == 'accept_word' then
    ghost.accept_word(bufnr)
  elseif action == 'accept_line' then
    ghost.accept_line(bufnr)
  elseif action == 'next' then
    ghost.cycle(1, bufnr)
  elseif action == 'prev' then
    ghost.cycle(-1, bufnr)
  elseif action == 'dismiss' then
    ghost.dismiss(bufnr)
  end
end

local DESCRIPTIONS = {
  accept = 'kspec: accept the suggestion',
  accept_word = 'kspec: accept the next word',
  accept_line = 'kspec: accept the rest of the line',
  next = 'kspec: next alternative',
  prev = 'kspec: previous alternative',
  dismiss = 'kspec: dismiss the suggestion',
}

local function map_keys(bufnr)
  for action, lhs in pairs(M.opts.keys) do
    if lhs then
      local builtin = M.display() == 'builtin'
      if builtin and (action == 'accept_word' or action == 'accept_line') then
        goto continue -- not offered by vim.lsp.inline_completion
      end
      vim.keymap.set('i', lhs, function()
        if action == 'next' or action == 'prev' then
          return cmd(action)
        end
        if builtin then
          if action == 'accept' then
            -- get() accepts (scheduled) and says whether there was something to accept
            return vim.lsp.inline_completion.get({ bufnr = bufnr }) and '' or lhs
          end
          return cmd(action)
        end
        if ghost.visible(bufnr) then
          return cmd(action)
        end
        return lhs -- nothing shown: the key does what it does without kspec
      end, { buffer = bufnr, expr = true, replace_keycodes = true, silent = true, desc = DESCRIPTIONS[action] })
      ::continue::
    end
  end
end

local function on_attach(client, bufnr)
  if M.display() == 'builtin' then
    local ok, err = pcall(vim.lsp.inline_completion.enable, is_enabled(), { bufnr = bufnr })
    if not ok then
      vim.notify('kspec: vim.lsp.inline_completion.enable failed (' .. tostring(err) .. '); using ghost text', vim.log.levels.WARN)
      M.opts.inline = 'plugin'
    end
  end
  if M.display() == 'plugin' then
    ghost.attach(bufnr, client.id, M.opts, is_enabled)
  end
  map_keys(bufnr)
end

-- Server registration ------------------------------------------------------------

--- The settings as the server reads them: a JSON object, also when empty (an empty Lua
--- table would be encoded as the list []).
function M.server_settings()
  local settings = vim.deepcopy(M.opts.settings)
  if next(settings) == nil then
    return vim.empty_dict()
  end
  return settings
end

local function capabilities()
  return {
    textDocument = { inlineCompletion = { dynamicRegistration = false } },
    -- we ask again on M.SUGGESTIONS_UPDATED: the server may answer early for us
    experimental = { kspec = { suggestionsUpdated = true } },
  }
end

--- Sent by the server when a request's background decoding stored longer alternatives in
--- its typeahead cache for { uri, version } (the short first answer was already returned):
--- asking again now is answered from that cache at once. `final`: the decoding is over
--- (interim ones come while it goes on, at most every 300 ms).
M.SUGGESTIONS_UPDATED = '$/kspec/suggestionsUpdated'

--- vim.lsp.inline_completion has no "request now": its automatic request runs on
--- CursorMovedI, from its own autocommand group for this buffer (only that group runs).
local function builtin_request(bufnr)
  return (pcall(api.nvim_exec_autocmds, 'CursorMovedI', { group = ('nvim.lsp.inline_completion:%d'):format(bufnr), buffer = bufnr, modeline = false }))
end

--- Handler of M.SUGGESTIONS_UPDATED: if that document is the current buffer, attached to
--- that client, in insert mode and enabled, and still at that version (with ghost text
--- also: or showing that request's answer, typed into since), ask again, unless the user
--- dismissed the suggestion at this text. Every one does,
--- interim or final, also after next / prev. A final one ends the document's decoding:
--- next / prev pressed meanwhile (a join, ghost.lua) step over the answer asked for now.
--- Returns (for tests) whether a new request was started (or a join ended): nil when the
--- check is deferred (called in a fast event), else true / false.
function M.on_suggestions_updated(_, params, ctx)
  if type(params) ~= 'table' or type(params.uri) ~= 'string' or type(params.version) ~= 'number' then
    return false
  end
  if vim.in_fast_event() then
    vim.schedule(function()
      M.on_suggestions_updated(nil, params, ctx)
    end)
    return nil
  end
  local final = params.final == true
  if final and ctx and ctx.client_id then
    status.finished(ctx.client_id, params.uri)
  end
  local bufnr = api.nvim_get_current_buf()
  if not is_enabled() or vim.uri_from_bufnr(bufnr) ~= params.uri or not api.nvim_get_mode().mode:find('^i') then
    return false
  end
  if ctx and ctx.client_id and not vim.lsp.buf_is_attached(bufnr, ctx.client_id) then
    return false
  end
  local same_version = vim.lsp.util.buf_versions[bufnr] == params.version
  if M.display() == 'plugin' then
    -- typed into the suggestion since: the server's typeahead cache answers for the text now
    local ours = same_version or ghost.shows_answer_of(bufnr, params.version)
    if final and ghost.joining(bufnr) then
      return ghost.finish_join(bufnr, ours) -- asks for the final alternatives, then steps
    end
    return ours and ghost.refresh(bufnr)
  end
  if not same_version then
    return false -- typed on since: that answer is not for this text
  end
  if ghost.dismissed_here(bufnr) then
    return false -- dismissed at this text
  end
  return builtin_request(bufnr)
end

--- Handler of status.METHOD: the statusline's state; when the engine turns ready after
--- loading (or an error), the request the user made meanwhile is asked again.
function M.on_status(err, params, ctx)
  local before = ctx and status.by_client[ctx.client_id]
  status.handler(err, params, ctx)
  local after = ctx and status.by_client[ctx.client_id]
  if after and after ~= before then
    vim.schedule(ghost.on_status) -- a join whose document no longer decodes ends
  end
  if before and before.state ~= 'ready' and after and after.state == 'ready' then
    vim.schedule(function()
      M.ask_when_ready(ctx.client_id)
    end)
  end
end

--- The engine just became ready: in insert mode in a buffer of that client with nothing
--- shown, ask for completions without waiting for a keystroke. Returns (for tests)
--- whether a request was started.
function M.ask_when_ready(client_id)
  local bufnr = api.nvim_get_current_buf()
  if not is_enabled() or not api.nvim_get_mode().mode:find('^i') or not vim.lsp.buf_is_attached(bufnr, client_id) then
    return false
  end
  if M.display() == 'plugin' then
    if ghost.visible(bufnr) then
      return false
    end
    ghost.trigger(bufnr)
    return true
  end
  return builtin_request(bufnr)
end

local function handlers()
  return { [status.METHOD] = M.on_status, [M.SUGGESTIONS_UPDATED] = M.on_suggestions_updated }
end

--- One kspec process per Neovim: completions do not depend on the workspace root.
local function reuse_client(client, cfg)
  -- (is_stopped ignores its argument on 0.10, so the method call works on both)
  return client.name == cfg.name and not client:is_stopped()
end

local function on_exit(_, _, client_id)
  status.forget(client_id)
end

local function register_011()
  vim.lsp.config(NAME, {
    cmd = function(dispatchers, cfg)
      local command, where = server.find(cfg.root_dir, M.opts)
      if not command then
        error(where, 0)
      end
      return vim.lsp.rpc.start(command, dispatchers, { cwd = cfg.root_dir, env = M.opts.cmd_env })
    end,
    filetypes = config.filetypes(M.opts),
    root_dir = function(bufnr, on_dir)
      local root = root_of(bufnr)
      local command, where = server.find(root, M.opts)
      if command then
        on_dir(root)
      else
        report_missing(where)
      end
    end,
    reuse_client = reuse_client,
    init_options = M.server_settings(),
    settings = M.server_settings(),
    capabilities = capabilities(),
    handlers = handlers(),
    on_attach = on_attach,
    on_exit = on_exit,
  })
  vim.lsp.enable(NAME)
end

local function start_010(bufnr)
  if vim.bo[bufnr].buftype ~= '' then
    return
  end
  local fts = config.filetypes(M.opts)
  if fts and not vim.tbl_contains(fts, vim.bo[bufnr].filetype) then
    return
  end
  local root = root_of(bufnr)
  local command, where = server.find(root, M.opts)
  if not command then
    report_missing(where)
    return
  end
  vim.lsp.start({
    name = NAME,
    cmd = command,
    cmd_cwd = root,
    cmd_env = M.opts.cmd_env,
    root_dir = root,
    init_options = M.server_settings(),
    settings = M.server_settings(),
    capabilities = vim.tbl_deep_extend('force', vim.lsp.protocol.make_client_capabilities(), capabilities()),
    handlers = handlers(),
    on_attach = on_attach,
    on_exit = on_exit,
  }, { bufnr = bufnr, reuse_client = reuse_client })
end

local function register_010()
  local group = api.nvim_create_augroup('kspec.start', { clear = true })
  api.nvim_create_autocmd('FileType', {
    group = group,
    callback = function(args)
      start_010(args.buf)
    end,
  })
  for _, bufnr in ipairs(api.nvim_list_bufs()) do
    if api.nvim_buf_is_loaded(bufnr) and vim.bo[bufnr].filetype ~= '' then
      start_010(bufnr)
    end
  end
end

-- Public API ----------------------------------------------------------------------

--- Send the current settings to the running servers.
local function push_settings()
  for _, client in ipairs(M.clients()) do
    client.settings = M.server_settings()
    if has('nvim-0.11') then
      client:notify('workspace/didChangeConfiguration', { settings = client.settings })
    else
      client.notify('workspace/didChangeConfiguration', { settings = client.settings })
    end
  end
end

--- Change server settings at run time, e.g. require('kspec').set({ k = 5 }).
function M.set(settings)
  assert(M.opts, 'kspec: call setup() first')
  local merged = vim.tbl_extend('force', M.opts.settings, settings or {})
  local opts, problems = config.resolve(vim.tbl_extend('force', M.opts, { settings = merged }))
  for _, p in ipairs(problems) do
    vim.notify('kspec: ' .. p, vim.log.levels.WARN)
  end
  M.opts.settings = opts.settings
  push_settings()
end

--- Turn completions on or off (nil: toggle). Sent to the server as `enabled`.
function M.enable(on)
  assert(M.opts, 'kspec: call setup() first')
  if on == nil then
    on = not is_enabled()
  end
  M.opts.settings.enabled = on
  push_settings()
  if not on then
    ghost.clear_all()
  end
  if M.display() == 'builtin' then
    for _, client in ipairs(M.clients()) do
      for bufnr in pairs(client.attached_buffers or {}) do
        pcall(vim.lsp.inline_completion.enable, on, { bufnr = bufnr })
      end
    end
  end
  status.redraw()
end

function M.is_enabled()
  return is_enabled()
end

--- For a statusline: "kspec 85ms", "kspec 42%", "kspec busy", "kspec timed out",
--- "kspec error", "kspec off", or "" (no server). Redrawn on each status change.
function M.statusline()
  if not M.opts or #M.clients() == 0 then
    return ''
  end
  return status.text(status.current(), is_enabled())
end

--- Stop the server(s) and start again for the loaded buffers.
function M.restart()
  assert(M.opts, 'kspec: call setup() first')
  local clients = M.clients()
  for _, client in ipairs(clients) do
    if has('nvim-0.11') then
      client:stop()
    else
      client.stop()
    end
  end
  -- Wait (bounded) for them to go, then attach again.
  vim.wait(5000, function()
    return #M.clients() == 0
  end, 20)
  if has('nvim-0.11') then
    vim.lsp.enable(NAME, false)
    vim.lsp.enable(NAME, true)
  else
    for _, bufnr in ipairs(api.nvim_list_bufs()) do
      if api.nvim_buf_is_loaded(bufnr) then
        start_010(bufnr)
      end
    end
  end
end

--- A highlight like `base`, with a terminal colour when `base` has none: the default
--- colour scheme gives Comment and NonText only GUI colours, so without 'termguicolors'
--- (tmux, many terminals) a link would draw suggestions in the normal text colour.
local function like(base, cterm_fallback)
  local hl = api.nvim_get_hl(0, { name = base, link = false })
  return {
    fg = hl.fg,
    bg = hl.bg,
    italic = hl.italic,
    ctermfg = hl.ctermfg or cterm_fallback,
    ctermbg = hl.ctermbg,
    cterm = hl.cterm,
    default = true, -- a colour scheme's own KspecGhost wins
  }
end

local GREY = 8 -- "bright black": grey on 16- and 256-colour terminals

local function define_highlights()
  api.nvim_set_hl(0, 'KspecGhost', like('Comment', GREY))
  api.nvim_set_hl(0, 'KspecGhostCount', like('NonText', GREY))
end

local function define_commands()
  api.nvim_create_user_command('KspecToggle', function()
    M.enable()
    vim.notify('kspec: completions ' .. (is_enabled() and 'on' or 'off'))
  end, { desc = 'kspec: turn completions on or off' })
  api.nvim_create_user_command('KspecRestart', function()
    M.restart()
  end, { desc = 'kspec: restart the server' })
  api.nvim_create_user_command('KspecStatus', function()
    local s = status.current()
    local line = M.statusline()
    if s and s.message ~= '' then
      line = line .. ': ' .. s.message
    end
    line = line .. status.alternatives_note(s)
    vim.notify(line ~= '' and line or 'kspec: no server running')
  end, { desc = 'kspec: show the engine status' })
  api.nvim_create_user_command('KspecLog', function()
    M.open_logs()
  end, { desc = "kspec: open the engine daemon's log and the LSP log (kspec lsp's stderr)" })
end

--- The logs a user looks at: the engine daemon's (its path comes with the status; none
--- for an engine inside kspec lsp, whose messages are kspec lsp's stderr) and Neovim's
--- LSP log, where kspec lsp's stderr goes. Opened in a new tab, the engine's on top.
function M.logs()
  local s = status.current()
  return { engine = s and s.logFile or nil, lsp = vim.lsp.get_log_path() }
end

function M.open_logs()
  local logs = M.logs()
  vim.cmd('tabnew ' .. vim.fn.fnameescape(logs.lsp))
  if logs.engine then
    vim.cmd('aboveleft split ' .. vim.fn.fnameescape(logs.engine))
  end
end

function M.setup(user)
  if vim.fn.has('nvim-0.10') ~= 1 then
    vim.notify('kspec: needs Neovim 0.10 or newer', vim.log.levels.ERROR)
    return
  end
  local opts, problems = config.resolve(user)
  M.opts, M.problems = opts, problems
  if opts.inline == 'builtin' and M.display() ~= 'builtin' then
    problems[#problems + 1] = 'inline = "builtin" needs Neovim 0.12 (vim.lsp.inline_completion); using ghost text'
  end
  for _, p in ipairs(problems) do
    vim.notify('kspec: ' .. p, vim.log.levels.WARN)
  end
  status.notify_errors = opts.notify_errors
  define_highlights()
  local group = api.nvim_create_augroup('kspec.highlights', { clear = true })
  api.nvim_create_autocmd('ColorScheme', { group = group, callback = define_highlights })
  -- blink.cmp's menu (nvim-cmp's and Neovim's popup menu are checked where the ghost is drawn)
  api.nvim_create_autocmd('User', {
    group = group,
    pattern = 'BlinkCmpMenuOpen',
    callback = function()
      ghost.clear(api.nvim_get_current_buf())
    end,
  })
  define_commands()
  if vim.lsp.config ~= nil and vim.lsp.enable ~= nil and has('nvim-0.11') then
    register_011()
  else
    register_010()
  end
end

return M
