-- Options of require('kspec').setup(): defaults, validation, and the settings table
-- sent to the server (its own key names, as initializationOptions and
-- workspace/didChangeConfiguration).
local M = {}

M.defaults = {
  -- Command that starts the server, as a list ({ '/path/to/kspec', 'lsp' }).
  -- nil: `kspec lsp`, with kspec found in the project (.venv, venv, .env, env under the
  -- root), then $VIRTUAL_ENV, $CONDA_PREFIX, then PATH.
  cmd = nil,
  -- Extra environment for the server process.
  cmd_env = nil,
  -- Files that mark the project root (where .venv is looked for).
  root_markers = { 'pyproject.toml', 'setup.py', 'setup.cfg', 'package.json', 'Cargo.toml', 'go.mod', '.git' },
  -- Server settings, under the server's names. Only what is set here is sent; the
  -- server's defaults apply to the rest. Known keys: SERVER_KEYS below (the server's
  -- lsp_server/settings.py; tests/unit/lsp/test_settings_schema.py keeps the two equal).
  -- A team engine: engine = 'openai', engineUrl = 'https://gpu-box:8000/v1',
  -- engineTokenFile = '~/.config/kspec/token' (the file's path, never the token).
  -- vim.NIL sends null (e.g. set({ engineUrl = vim.NIL }) to unset a nullable key).
  settings = {},
  -- How completions are shown: 'auto' (Neovim's vim.lsp.inline_completion on 0.12+,
  -- this plugin's ghost text before), 'builtin' or 'plugin'.
  inline = 'auto',
  -- Ghost text (the plugin's own display, 0.10 / 0.11 or inline = 'plugin').
  ghost = {
    debounce_ms = 30, -- client-side wait after the last keystroke (the server debounces too)
    position = 'inline', -- 'inline' (pushes the rest of the line right) or 'overlay'
    show_count = true, -- " (i/k)" after the line
  },
  -- Insert-mode keys; false to leave a key unmapped.
  keys = {
    accept = '<Tab>', -- falls back to a normal <Tab> when nothing is shown
    accept_word = '<M-Right>',
    accept_line = '<M-C-Right>',
    next = '<M-]>', -- with nothing shown: ask for completions now
    prev = '<M-[>',
    dismiss = '<C-]>',
  },
  -- Also vim.notify engine errors ($/kspec/status "error"). Off by default: kspec lsp
  -- reports them once with window/showMessage, which Neovim already shows.
  notify_errors = false,
}

-- 'nil' marks the keys that may be null (given as vim.NIL); the server checks the values.
local SERVER_KEYS = {
  model = { 'string', 'nil' },
  draft = { 'string', 'nil' },
  device = 'string',
  dtype = 'string',
  promptTokens = { 'number', 'nil' }, -- pin the prompt's token budget; nil: what this machine prefills cold in ~0.5 s
  -- where completions are computed: 'daemon' (default), 'inprocess', 'remote' (a kspec
  -- engine on the network), 'openai' (an OpenAI-compatible /v1/completions server)
  engine = 'string',
  engineUrl = { 'string', 'nil' }, -- tcp:// or tls://HOST:PORT (remote), http(s)://HOST:PORT/v1 (openai)
  engineTokenFile = { 'string', 'nil' }, -- a file holding the token / API key (~ is expanded by the server)
  engineCaFile = { 'string', 'nil' }, -- TLS: trust this certificate or CA (self-signed servers)
  allowInsecureRemote = 'boolean', -- allow an engineUrl on another machine over plain http:// or tcp:// (refused otherwise)
  remoteModel = { 'string', 'nil' }, -- openai: the model to ask for; null: the first listed
  remoteFim = 'string', -- openai: 'auto', 'suffix' or a template with {prefix} and {suffix}
  k = 'number',
  maxTokens = 'number',
  mode = 'string',
  temperature = 'number',
  debounceMs = 'number',
  deadlineMs = 'number',
  firstAnswerMs = { 'number', 'nil' }, -- answer with what is complete this soon (ms), then decode on; 0: off, nil: the engine's choice
  languages = 'table',
  enabled = 'boolean',
  contextFiles = 'boolean', -- other open files of the workspace folder and imported definitions as context
  contextTokens = 'number', -- their cap in tokens (the engine may choose less)
  -- further server keys
  prefixChars = 'number',
  suffixChars = 'number',
  typeahead = 'boolean',
  raw = 'boolean', -- untrimmed, unranked alternatives (comparisons)
  debugLog = 'boolean',
}
M.SERVER_KEYS = SERVER_KEYS

local function type_ok(value, want)
  if type(want) == 'table' then
    for _, w in ipairs(want) do
      if type(value) == w or (w == 'nil' and value == vim.NIL) then
        return true
      end
    end
    return false
  end
  return type(value) == want
end

--- Merge user options over the defaults and check them.
--- @return table opts, string[] problems (one line each; the bad value is dropped)
function M.resolve(user)
  local problems = {}
  user = user or {}
  if type(user) ~= 'table' then
    return vim.deepcopy(M.defaults), { 'setup() expects a table' }
  end
  local opts = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), user)
  -- settings are replaced, not merged with defaults (there are none on this side)
  opts.settings = vim.deepcopy(user.settings or {})
  for key, value in pairs(opts.settings) do
    local want = SERVER_KEYS[key]
    if want == nil then
      problems[#problems + 1] = ('settings.%s: not a kspec server setting (sent anyway)'):format(key)
    elseif not type_ok(value, want) then
      problems[#problems + 1] = ('settings.%s: expected %s, got %s; dropped'):format(
        key,
        type(want) == 'table' and table.concat(want, ' or ') or want,
        type(value)
      )
      opts.settings[key] = nil
    end
  end
  if opts.cmd ~= nil and (type(opts.cmd) ~= 'table' or type(opts.cmd[1]) ~= 'string') then
    problems[#problems + 1] = 'cmd: expected a list like { "kspec", "lsp" }; finding kspec instead'
    opts.cmd = nil
  end
  if not vim.tbl_contains({ 'auto', 'builtin', 'plugin' }, opts.inline) then
    problems[#problems + 1] = ('inline: expected "auto", "builtin" or "plugin", got %s'):format(vim.inspect(opts.inline))
    opts.inline = 'auto'
  end
  if not vim.tbl_contains({ 'inline', 'overlay' }, opts.ghost.position) then
    problems[#problems + 1] = ('ghost.position: expected "inline" or "overlay", got %s'):format(vim.inspect(opts.ghost.position))
    opts.ghost.position = 'inline'
  end
  if type(opts.ghost.debounce_ms) ~= 'number' or opts.ghost.debounce_ms < 0 then
    problems[#problems + 1] = 'ghost.debounce_ms: expected a number >= 0'
    opts.ghost.debounce_ms = M.defaults.ghost.debounce_ms
  end
  for name, lhs in pairs(opts.keys) do
    if M.defaults.keys[name] == nil then
      problems[#problems + 1] = ('keys.%s: unknown key action'):format(name)
      opts.keys[name] = nil
    elseif lhs ~= false and type(lhs) ~= 'string' then
      problems[#problems + 1] = ('keys.%s: expected a key like "<Tab>" or false'):format(name)
      opts.keys[name] = M.defaults.keys[name]
    end
  end
  return opts, problems
end

--- Completions on? (`settings.enabled` unset means on.)
function M.enabled(opts)
  return opts.settings.enabled ~= false
end

--- Filetypes to attach to: settings.languages when given (and not "*"), else all.
function M.filetypes(opts)
  local langs = opts.settings.languages
  if type(langs) ~= 'table' or #langs == 0 or vim.tbl_contains(langs, '*') then
    return nil
  end
  return vim.deepcopy(langs)
end

return M
