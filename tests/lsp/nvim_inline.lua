-- Headless Neovim 0.11: attach `kspec lsp` with vim.lsp.start and ask for an inline
-- completion (Neovim 0.11 has no inline-completion UI, so the request is made by hand).
-- Neovim's own LSP client declares no kspec extension: the server must answer it whole.
-- Prints one JSON line: {"encoding": ..., "answer": {"err": ..., "result": ...}, "again": ..., "stats": ...}.
-- Arguments (after -l script): python, model folder, file path.
local python, model, path = arg[1], arg[2], arg[3]
local function fail(message)
  io.stdout:write(vim.json.encode({ error = message }) .. "\n")
  vim.cmd("qa!")
end

vim.cmd.edit(path)
local buf = vim.api.nvim_get_current_buf()
vim.bo[buf].filetype = "python"
vim.api.nvim_buf_set_lines(buf, 0, -1, false, { "def add(a, b):", "    return " })

local ready = false
local client_id = vim.lsp.start({
  name = "kspec",
  cmd = { python, "-m", "kspec.cli.main", "lsp", "--engine", "inprocess" },
  root_dir = vim.fs.dirname(path),
  init_options = { model = model, k = 2, maxTokens = 32, firstAnswerMs = 1, debounceMs = 0, deadlineMs = 30000, raw = true },
  handlers = {
    ["$/kspec/status"] = function(_, result)
      if result and result.state == "ready" then
        ready = true
      end
    end,
  },
}, { bufnr = buf })
if not client_id then
  return fail("vim.lsp.start returned nil")
end
if not vim.wait(90000, function() return ready end, 50) then
  return fail("the server never reported ready")
end

local client = vim.lsp.get_client_by_id(client_id)
local params = {
  textDocument = { uri = vim.uri_from_bufnr(buf) },
  position = { line = 1, character = 11 },
  context = { triggerKind = 1 },
}
local results = vim.lsp.buf_request_sync(buf, "textDocument/inlineCompletion", params, 60000)
local again = vim.lsp.buf_request_sync(buf, "textDocument/inlineCompletion", params, 60000)
local stats = vim.lsp.buf_request_sync(buf, "kspec/stats", vim.NIL, 10000)
io.stdout:write(vim.json.encode({
  encoding = client.offset_encoding,
  answer = results and results[client_id] or vim.NIL,
  again = again and again[client_id] or vim.NIL,
  stats = stats and stats[client_id] and stats[client_id].result or vim.NIL,
}) .. "\n")
client:stop()
vim.wait(10000, function() return client:is_stopped() end, 50)
vim.cmd("qa!")
