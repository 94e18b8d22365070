-- Which `kspec` to start: the project's environment first, then the active one, then PATH.
local M = {}

local VENVS = { '.venv', 'venv', '.env', 'env' }

local function is_windows()
  return vim.fn.has('win32') == 1
end

local function in_env(root)
  if is_windows() then
    return { root .. '/Scripts/kspec.exe', root .. '/Scripts/kspec' }
  end
  return { root .. '/bin/kspec' }
end

--- Find the server command.
--- @param root string|nil project root (where .venv is looked for)
--- @param opts table resolved setup() options
--- @return string[]|nil cmd, string where-or-error
function M.find(root, opts)
  if opts.cmd then
    return vim.deepcopy(opts.cmd), 'setup({ cmd = ... })'
  end
  local looked = {}
  local candidates = {}
  if root then
    for _, venv in ipairs(VENVS) do
      for _, file in ipairs(in_env(root .. '/' .. venv)) do
        candidates[#candidates + 1] = { file, 'project environment ' .. root .. '/' .. venv }
      end
    end
  end
  for _, var in ipairs({ 'VIRTUAL_ENV', 'CONDA_PREFIX' }) do
    local dir = vim.env[var]
    if dir and dir ~= '' then
      for _, file in ipairs(in_env(dir)) do
        candidates[#candidates + 1] = { file, '$' .. var }
      end
    end
  end
  for _, c in ipairs(candidates) do
    looked[#looked + 1] = c[1]
    if vim.fn.executable(c[1]) == 1 then
      return { c[1], 'lsp' }, c[2]
    end
  end
  local on_path = vim.fn.exepath('kspec')
  if on_path ~= '' then
    return { on_path, 'lsp' }, 'PATH'
  end
  looked[#looked + 1] = 'PATH'
  return nil,
    'kspec was not found (looked at ' .. table.concat(looked, ', ') .. '). '
      .. 'Install it in the project environment (pip install kspec) or pass setup({ cmd = { "/path/to/kspec", "lsp" } }).'
end

return M
