-- Ghost text for Neovim 0.10 / 0.11 (and for inline = 'plugin' on 0.12+).
--
-- TextChangedI (debounced) sends textDocument/inlineCompletion; the k items come back
-- and the current one is drawn as virtual text at the cursor (first line inline or
-- overlay, further lines as virt_lines) with " (i/k)" at the end of the line.
-- Typing the next characters of the shown text keeps it (no new request); moving the
-- cursor, leaving insert mode or leaving the buffer cancels the request and hides it.
-- When the server says it has longer alternatives for the buffer as it is
-- ($/kspec/suggestionsUpdated, see init.lua), refresh() asks again without hiding what is
-- shown; the answer replaces it, keeping the alternative the user was looking at.
-- Cycling while the server still decodes for the buffer (an early answer is shown) joins
-- that decoding: the step waits for the final alternatives, shows them, then steps, so
-- next / prev go over the final k, never over interim ones that are about to change.
-- Cycling after typing into the suggestion first asks at the text as typed: the server
-- tops the alternatives that go on with it up to k (as VS Code's Alt+] does there).
local M = {}

local api = vim.api
local uv = vim.uv or vim.loop
local status = require('kspec.status')

--- After the status says a document no longer decodes, how long its final
--- $/kspec/suggestionsUpdated may still take to come (the server tells the status first).
M.GRACE_MS = 100
--- How long a join waits at most when settings.deadlineMs is not set (the server's default).
M.JOIN_TIMEOUT_MS = 3000

M.namespace = api.nvim_create_namespace('kspec.ghost')

local TRIGGER_INVOKED, TRIGGER_AUTOMATIC = 1, 2 -- LSP 3.18 InlineCompletionTriggerKind

--- bufnr -> state
--- state = {
---   client_id, opts, timer, seq,
---   pending = { client, id } | nil,       -- request in flight
---   anchor = { row, col, before } | nil,  -- cursor (0-based row, byte col) the items are for
---   tick,                                 -- b:changedtick the anchor/typed were computed at
---   items = { { text, insert, row, scol, ecol } } | nil,  -- text: what follows the anchor
---   index, typed,                         -- current item; characters typed since the anchor
---   version,                              -- LSP document version of the request the items answer
---   join = { delta, timer, final, stay } | nil,  -- next / prev waiting for the final alternatives
--- }
local buffers = {}

local function has011()
  return vim.fn.has('nvim-0.11') == 1
end

local function client_request(client, method, params, handler, bufnr)
  if has011() then
    return client:request(method, params, handler, bufnr)
  end
  return client.request(method, params, handler, bufnr)
end

local function client_cancel(client, id)
  if has011() then
    return client:cancel_request(id)
  end
  return client.cancel_request(id)
end

--- Byte column of an LSP `character` in `line` for the client's position encoding.
function M.byte_col(line, character, encoding)
  if character <= 0 then
    return 0
  end
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col
  if has011() then
    ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  else
    ok, col = pcall(vim.str_byteindex, line, character, encoding == 'utf-16')
  end
  if ok and col then
    return math.min(col, #line)
  end
  return #line
end

local function cursor()
  local pos = api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2]
end

local function line_at(bufnr, row)
  return api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
end

local function in_insert()
  return api.nvim_get_mode().mode:sub(1, 1) == 'i'
end

local function hide(bufnr)
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  end
end

local function close_timer(timer)
  if timer and not timer:is_closing() then
    timer:stop()
    timer:close()
  end
end

--- Forget a join (its steps are dropped).
local function drop_join(st)
  if st.join then
    close_timer(st.join.timer)
    st.join = nil
  end
end

local function cancel_pending(st)
  if st.timer then
    st.timer:stop()
  end
  if st.pending then
    pcall(client_cancel, st.pending.client, st.pending.id)
    st.pending = nil
  end
end

--- Hide the ghost text, forget the items and cancel what is in flight.
function M.clear(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local st = buffers[bufnr]
  if not st then
    return
  end
  st.seq = st.seq + 1 -- late answers are dropped
  cancel_pending(st)
  drop_join(st)
  st.items, st.index, st.typed, st.anchor = nil, nil, '', nil
  hide(bufnr)
end

local function current_item(st)
  return st and st.items and st.items[st.index] or nil
end

--- The text still to show for the current item ('' when none).
local function rest_of(st)
  local item = current_item(st)
  return item and item.text:sub(#st.typed + 1) or ''
end

--- A completion menu is open: Neovim's popup menu (Ctrl-N, omni), nvim-cmp's or blink.cmp's.
local function pum_visible()
  if vim.fn.pumvisible() == 1 then
    return true
  end
  local cmp = package.loaded['cmp']
  if type(cmp) == 'table' and type(cmp.visible) == 'function' and cmp.visible() then
    return true
  end
  local blink = package.loaded['blink.cmp']
  if type(blink) == 'table' then
    for _, name in ipairs({ 'is_menu_visible', 'is_visible' }) do
      if type(blink[name]) == 'function' then
        local ok, shown = pcall(blink[name])
        return ok and shown == true
      end
    end
  end
  return false
end
M.menu_visible = pum_visible

--- Is the shown suggestion still for the text and cursor as they are now? It is made for
--- one state (the anchor, what was typed into it since, b:changedtick); a popup menu or
--- a change no autocommand told us about (Ctrl-N inserts its match without TextChangedI)
--- makes it stale, and accepting it then would corrupt the line.
local function current(bufnr, st)
  if not current_item(st) or api.nvim_get_current_buf() ~= bufnr or not in_insert() or pum_visible() then
    return false
  end
  if api.nvim_buf_get_changedtick(bufnr) ~= st.tick then
    return false
  end
  local row, col = cursor()
  if row ~= st.anchor.row or col ~= st.anchor.col + #st.typed then
    return false
  end
  local line = line_at(bufnr, row)
  return line:sub(1, st.anchor.col) == st.anchor.before and line:sub(st.anchor.col + 1, col) == st.typed
end

--- The lines to show for `rest`, the text still to insert, when accepting it also replaces
--- `replaced`, text right of the cursor (closing brackets the server's range covers): that
--- text is on screen already, so the ghost leaves it out of its last line.
function M.display_lines(rest, replaced)
  local lines = vim.split(rest, '\n', { plain = true })
  local last = lines[#lines]
  if replaced ~= '' and #last >= #replaced and last:sub(-#replaced) == replaced then
    lines[#lines] = last:sub(1, #last - #replaced)
  end
  return lines
end

local function render(bufnr)
  local st = buffers[bufnr]
  hide(bufnr)
  if pum_visible() then
    return -- a popup menu is open: the ghost would read as part of it (and Tab is the menu's)
  end
  local item = current_item(st)
  if not item then
    return
  end
  local lines = M.display_lines(rest_of(st), item.replaced or '')
  local row, col = st.anchor.row, st.anchor.col + #st.typed
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], 'KspecGhost' } }
  end
  api.nvim_buf_set_extmark(bufnr, M.namespace, row, math.min(col, #line_at(bufnr, row)), {
    virt_text = { { lines[1], 'KspecGhost' } },
    virt_text_pos = st.opts.ghost.position,
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = 'combine',
    priority = 200,
  })
  if st.opts.ghost.show_count then
    -- "…": next / prev wait for the final alternatives (a join)
    api.nvim_buf_set_extmark(bufnr, M.namespace, row, 0, {
      virt_text = { { (' (%d/%d%s)'):format(st.index, #st.items, st.join and ' …' or ''), 'KspecGhostCount' } },
      virt_text_pos = 'eol',
      hl_mode = 'combine',
      priority = 200,
    })
  end
end

--- Turn a response into items that continue the text at the anchor; drop the rest.
local function to_items(bufnr, result, encoding, anchor)
  local raw_items = type(result) == 'table' and (result.items or result) or {}
  local out, seen = {}, {}
  local line = line_at(bufnr, anchor.row)
  for _, raw in ipairs(raw_items) do
    local text = raw.insertText
    if type(text) == 'table' then
      text = text.value -- a snippet shown and inserted as plain text
    end
    if type(text) == 'string' then
      local scol, ecol = anchor.col, anchor.col
      local ok = true
      if type(raw.range) == 'table' then
        local s, e = raw.range.start, raw.range['end']
        if s.line ~= anchor.row or e.line ~= anchor.row then
          ok = false -- multi-line replacements cannot be shown as ghost text
        else
          scol = M.byte_col(line, s.character, encoding)
          ecol = M.byte_col(line, e.character, encoding)
          ok = scol <= anchor.col and ecol >= anchor.col
        end
      end
      if ok then
        local typed = line:sub(scol + 1, anchor.col)
        if text:sub(1, #typed) == typed then
          local rest = text:sub(#typed + 1)
          if rest ~= '' and not seen[rest] then
            seen[rest] = true
            local replaced = line:sub(anchor.col + 1, ecol) -- right of the cursor, replaced on accept
            out[#out + 1] = { text = rest, insert = text, row = anchor.row, scol = scol, ecol = ecol, replaced = replaced, command = raw.command }
          end
        end
      end
    end
  end
  return out
end

local function find_client(st)
  local client = vim.lsp.get_client_by_id(st.client_id)
  if client and not client:is_stopped() then
    return client
  end
  return nil
end

local function send(bufnr, seq, trigger)
  local st = buffers[bufnr]
  if not st or st.seq ~= seq or not in_insert() or api.nvim_get_current_buf() ~= bufnr then
    return
  end
  if api.nvim_buf_get_changedtick(bufnr) ~= st.tick then
    return
  end
  local row, col = cursor()
  if not st.anchor or row ~= st.anchor.row or col ~= st.anchor.col then
    return
  end
  local client = find_client(st)
  if not client then
    return
  end
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = trigger }
  local version = vim.lsp.util.buf_versions[bufnr] -- the document version the server answers for
  local ok, id = client_request(client, 'textDocument/inlineCompletion', params, function(err, result)
    if st.seq ~= seq then
      return -- superseded or cancelled
    end
    st.pending = nil
    if err then
      vim.lsp.log.warn('kspec: inlineCompletion failed', err)
      M._settle_join(bufnr)
      return
    end
    if not in_insert() or api.nvim_get_current_buf() ~= bufnr or api.nvim_buf_get_changedtick(bufnr) ~= st.tick or pum_visible() then
      return
    end
    local r, c = cursor()
    if r ~= st.anchor.row or c ~= st.anchor.col then
      return
    end
    local items = to_items(bufnr, result, client.offset_encoding, st.anchor)
    if #items == 0 then
      M._settle_join(bufnr)
      return -- (a refresh that brings nothing keeps what is shown)
    end
    -- after a refresh, stay on the alternative that was shown: its longer version (a join
    -- for decoding that was going on starts from the first of the final alternatives, as
    -- VS Code's does, then steps; one that asked after typing steps from the one shown)
    local index, shown = 1, current_item(st)
    if shown and not (st.join and st.join.final and not st.join.stay) then
      for i, item in ipairs(items) do
        if item.text:sub(1, #shown.text) == shown.text then
          index = i
          break
        end
      end
    end
    st.items, st.index, st.typed, st.version = items, index, '', version
    render(bufnr)
    M._settle_join(bufnr)
  end, bufnr)
  if ok and id then
    st.pending = { client = client, id = id }
  end
end

--- Anchor a new request at the cursor; send it after `delay` ms.
local function schedule(bufnr, delay, trigger)
  local st = buffers[bufnr]
  M.clear(bufnr)
  if vim.b[bufnr].kspec_dismissed_tick ~= nil then
    vim.b[bufnr].kspec_dismissed_tick = nil -- the user asks (a key, a move, a trigger)
  end
  local row, col = cursor()
  st.anchor = { row = row, col = col, before = line_at(bufnr, row):sub(1, col) }
  st.typed = ''
  st.tick = api.nvim_buf_get_changedtick(bufnr)
  local seq = st.seq
  if delay <= 0 then
    send(bufnr, seq, trigger)
    return
  end
  st.timer:stop()
  st.timer:start(delay, 0, vim.schedule_wrap(function()
    send(bufnr, seq, trigger)
  end))
end

--- The user typed characters the shown item continues with: keep showing its rest.
local function typeahead(bufnr, st)
  if not st.items or not st.anchor then
    return false
  end
  local row, col = cursor()
  if row ~= st.anchor.row or col < st.anchor.col then
    return false
  end
  local line = line_at(bufnr, row)
  if line:sub(1, st.anchor.col) ~= st.anchor.before then
    return false
  end
  local typed = line:sub(st.anchor.col + 1, col)
  local kept, index = {}, 1
  for i, item in ipairs(st.items) do
    if #item.text > #typed and item.text:sub(1, #typed) == typed then
      kept[#kept + 1] = item
      if i == st.index then
        index = #kept
      end
    end
  end
  if #kept == 0 then
    return false
  end
  st.items, st.index, st.typed = kept, index, typed
  st.tick = api.nvim_buf_get_changedtick(bufnr)
  render(bufnr)
  return true
end

local function enabled(st)
  return st.is_enabled == nil or st.is_enabled()
end

local function on_text_changed(bufnr)
  local st = buffers[bufnr]
  if not st then
    return
  end
  if not enabled(st) or pum_visible() then
    M.clear(bufnr)
    return
  end
  if typeahead(bufnr, st) then
    return
  end
  schedule(bufnr, st.opts.ghost.debounce_ms, TRIGGER_AUTOMATIC)
end

local function on_cursor_moved(bufnr)
  local st = buffers[bufnr]
  if not st or not st.anchor then
    return
  end
  if api.nvim_buf_get_changedtick(bufnr) ~= st.tick then
    return -- the text changed: TextChangedI (which comes next) decides
  end
  local row, col = cursor()
  if row == st.anchor.row and col == st.anchor.col + #st.typed then
    return
  end
  M.clear(bufnr)
end

--- Is a suggestion shown in this buffer, for the text and cursor as they are now (and no
--- popup menu open)? A stale one is hidden (scheduled: this runs inside <expr> mappings).
function M.visible(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local st = buffers[bufnr]
  if current(bufnr, st) then
    return true
  end
  if current_item(st) then
    vim.schedule(function()
      if not current(bufnr, st) then
        M.clear(bufnr)
      end
    end)
  end
  return false
end

--- What is shown: { index, count, text (still to insert), items (texts) } or nil.
function M.shown(bufnr)
  local st = buffers[bufnr or api.nvim_get_current_buf()]
  if not current_item(st) then
    return nil
  end
  local texts = {}
  for i, item in ipairs(st.items) do
    texts[i] = item.text:sub(#st.typed + 1)
  end
  return { index = st.index, count = #st.items, text = rest_of(st), items = texts }
end

--- Tell the server that an item was accepted, `taken` characters of it (nil: all), by
--- running its command (`kspec.accepted`): rank, language and lengths, never text.
local function report_accepted(st, item, taken)
  local command = item and item.command
  local client = st and vim.lsp.get_client_by_id(st.client_id)
  if type(command) ~= 'table' or type(command.arguments) ~= 'table' or not client then
    return
  end
  local argument = vim.deepcopy(command.arguments[1] or {})
  if taken then
    argument.accepted = taken
  end
  client_request(client, 'workspace/executeCommand', { command = command.command, arguments = { argument } }, function() end)
end

--- Accept the whole current suggestion. false when nothing is shown.
function M.accept(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local st = buffers[bufnr]
  local item = current_item(st)
  if not item then
    return false
  end
  if not current(bufnr, st) then
    M.clear(bufnr) -- made for another cursor or line: never applied
    return false
  end
  local typed = st.typed
  report_accepted(st, item)
  M.clear(bufnr)
  local lines = vim.split(item.insert, '\n', { plain = true })
  local ecol = math.min(item.ecol + #typed, #line_at(bufnr, item.row))
  api.nvim_buf_set_text(bufnr, item.row, item.scol, item.row, ecol, lines)
  local col = (#lines == 1 and item.scol or 0) + #lines[#lines]
  api.nvim_win_set_cursor(0, { item.row + #lines, col })
  return true
end

--- Accept part of the current suggestion: the next word or the rest of the line.
--- The remaining text stays shown.
local function accept_part(bufnr, what)
  bufnr = bufnr or api.nvim_get_current_buf()
  local st = buffers[bufnr]
  if not current_item(st) then
    return false
  end
  if not current(bufnr, st) then
    M.clear(bufnr)
    return false
  end
  local rest = rest_of(st)
  local piece
  if what == 'word' then
    piece = rest:match('^\n[ \t]*') or rest:match('^[ \t]*[%w_]+') or rest:match('^[ \t]*[^%w_%s]+') or rest:match('^%s+')
  else
    piece = rest:match('^[^\n]+') or rest:match('^\n[^\n]*')
  end
  if not piece or piece == '' then
    return false
  end
  if piece == rest then
    return M.accept(bufnr)
  end
  local item = current_item(st)
  report_accepted(st, item, vim.fn.strchars(item.insert) - vim.fn.strchars(rest) + vim.fn.strchars(piece))
  -- Surviving items continue after the accepted piece; they become plain insertions (not reported again).
  local prefix = st.typed .. piece
  local survivors, index = {}, 1
  for i, item in ipairs(st.items) do
    if #item.text > #prefix and item.text:sub(1, #prefix) == prefix then
      survivors[#survivors + 1] = item.text:sub(#prefix + 1)
      if i == st.index then
        index = #survivors
      end
    end
  end
  local row, col = cursor()
  M.clear(bufnr)
  local lines = vim.split(piece, '\n', { plain = true })
  api.nvim_buf_set_text(bufnr, row, col, row, col, lines)
  local new_row = row + #lines - 1
  local new_col = (#lines == 1 and col or 0) + #lines[#lines]
  api.nvim_win_set_cursor(0, { new_row + 1, new_col })
  st.anchor = { row = new_row, col = new_col, before = line_at(bufnr, new_row):sub(1, new_col) }
  st.tick = api.nvim_buf_get_changedtick(bufnr)
  st.typed = ''
  st.items = {}
  for i, text in ipairs(survivors) do
    st.items[i] = { text = text, insert = text, row = new_row, scol = new_col, ecol = new_col }
  end
  st.index = index
  if #st.items == 0 then
    st.items = nil
  end
  render(bufnr)
  return true
end

function M.accept_word(bufnr)
  return accept_part(bufnr, 'word')
end

function M.accept_line(bufnr)
  return accept_part(bufnr, 'line')
end

local function step(bufnr, st, delta)
  st.index = (st.index - 1 + delta) % #st.items + 1
  render(bufnr)
end

--- Does the server say it still decodes for this buffer (an early answer was given)?
local function decoding(bufnr, st)
  return status.is_decoding(st.client_id, vim.uri_from_bufnr(bufnr))
end

--- The join's wait is over: with the final alternatives shown (`final`: the answer asked
--- for them has come), or given up (the deadline): take its steps from what is shown.
local function apply_join(bufnr)
  local st = buffers[bufnr]
  local join = st and st.join
  if not join then
    return
  end
  drop_join(st)
  if current(bufnr, st) then
    step(bufnr, st, join.delta)
  elseif current_item(st) then
    render(bufnr) -- the counter loses its "…"
  end
end

--- Called when an answer to this buffer's request was handled: a join whose decoding is
--- over (join.final) takes its steps now, over the alternatives that answer brought.
function M._settle_join(bufnr)
  local st = buffers[bufnr]
  if st and st.join and st.join.final then
    apply_join(bufnr)
  end
end

--- The server's decoding for this buffer is over: a join asks for the final alternatives
--- (answered from the server's cache), shows them, then steps. true when a join was waiting.
function M.finish_join(bufnr, ask)
  local st = buffers[bufnr]
  if not st or not st.join then
    return false
  end
  st.join.final = true
  if not (ask and M.refresh(bufnr)) then
    apply_join(bufnr)
  end
  return true
end

--- Is a join waiting in this buffer?
function M.joining(bufnr)
  local st = buffers[bufnr or api.nvim_get_current_buf()]
  return st ~= nil and st.join ~= nil
end

--- A status arrived: a join whose document the server no longer decodes ends after
--- M.GRACE_MS unless the final $/kspec/suggestionsUpdated ended it first.
function M.on_status()
  for bufnr, st in pairs(buffers) do
    local join = st.join
    if join and not join.final and not decoding(bufnr, st) and not join.grace then
      join.grace = true
      vim.defer_fn(function()
        if st.join == join and not join.final and not decoding(bufnr, st) then
          M.finish_join(bufnr, true)
        elseif st.join == join then
          join.grace = nil
        end
      end, M.GRACE_MS)
    end
  end
end

--- Wait for the answer a join asked for (`final`), then step; M.JOIN_TIMEOUT_MS or
--- settings.deadlineMs bound the wait.
local function start_join(bufnr, st, join)
  st.join = join
  join.timer = uv.new_timer()
  local wait = tonumber(st.opts.settings and st.opts.settings.deadlineMs) or M.JOIN_TIMEOUT_MS
  join.timer:start(wait, 0, vim.schedule_wrap(function()
    if st.join == join then
      apply_join(bufnr)
    end
  end))
end

--- Show the next (delta = 1) or previous (-1) alternative; with nothing shown, ask now.
--- While the server still decodes for the buffer, the step joins that decoding: it is
--- taken over the final alternatives once they are shown (a deadline bounds the wait).
--- After the user typed into the suggestion, only the alternatives that go on with the
--- typed text are left: the step asks at the text as typed first (the server tops them
--- up to k, the one shown first) and is taken over that answer.
function M.cycle(delta, bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local st = buffers[bufnr]
  if not st then
    return false
  end
  if not current(bufnr, st) then
    if enabled(st) then
      schedule(bufnr, 0, TRIGGER_INVOKED)
    end
    return false
  end
  if st.join then
    st.join.delta = st.join.delta + delta
    return true
  end
  if decoding(bufnr, st) then
    start_join(bufnr, st, { delta = delta })
    render(bufnr)
    return true
  end
  if st.typed ~= '' then
    start_join(bufnr, st, { delta = delta, final = true, stay = true })
    if M.refresh(bufnr) then
      render(bufnr)
      return true
    end
    drop_join(st)
  end
  step(bufnr, st, delta)
  return true
end

--- The user dismissed the suggestion at the buffer's text as it is now (b:changedtick): the
--- decoding's later updates do not show it again there, in either display; a key asks again.
function M.mark_dismissed(bufnr)
  vim.b[bufnr].kspec_dismissed_tick = api.nvim_buf_get_changedtick(bufnr)
end

--- Was the suggestion dismissed at the buffer's text as it is now?
function M.dismissed_here(bufnr)
  return vim.b[bufnr].kspec_dismissed_tick == api.nvim_buf_get_changedtick(bufnr)
end

--- Hide the suggestion (and mark it dismissed); false when nothing was shown.
function M.dismiss(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local shown = M.visible(bufnr)
  M.clear(bufnr)
  M.mark_dismissed(bufnr)
  return shown
end

--- Ask for completions now, without waiting for a keystroke.
function M.trigger(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  if buffers[bufnr] then
    schedule(bufnr, 0, TRIGGER_INVOKED)
  end
end

--- Is what is shown the answer to a request made at document `version` (the user may
--- have typed into it since)?
function M.shows_answer_of(bufnr, version)
  local st = buffers[bufnr or api.nvim_get_current_buf()]
  return current_item(st) ~= nil and st.version == version
end

--- The shown items as if asked at the cursor: what was typed into them is dropped from
--- their text and becomes part of the line they replace.
local function rebase(st, row, col)
  local typed = st.typed
  if st.items and typed ~= '' then
    for i, item in ipairs(st.items) do
      local text = item.text:sub(#typed + 1)
      st.items[i] = { text = text, insert = text, row = row, scol = col, ecol = item.ecol + #typed }
    end
  end
  st.typed = ''
end

--- Ask again at the cursor, keeping what is shown until the answer replaces it: the
--- server stored longer alternatives for this text. false (nothing sent) unless this
--- buffer is current, in insert mode and enabled, with the cursor where the shown
--- suggestion (if any) goes on, and not dismissed at this text.
function M.refresh(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local st = buffers[bufnr]
  if not st or not enabled(st) or not in_insert() or api.nvim_get_current_buf() ~= bufnr then
    return false
  end
  if M.dismissed_here(bufnr) then
    return false -- dismissed: a suggestion that comes back by itself must be dismissed twice
  end
  local row, col = cursor()
  if st.anchor and (row ~= st.anchor.row or col ~= st.anchor.col + #st.typed) then
    return false -- moved since: CursorMovedI decides
  end
  if st.anchor and api.nvim_buf_get_changedtick(bufnr) ~= st.tick then
    return false -- a change TextChangedI has not seen yet: it decides
  end
  st.seq = st.seq + 1 -- an older request's answer is dropped
  st.refreshes = (st.refreshes or 0) + 1
  cancel_pending(st)
  rebase(st, row, col)
  st.anchor = { row = row, col = col, before = line_at(bufnr, row):sub(1, col) }
  st.tick = api.nvim_buf_get_changedtick(bufnr)
  send(bufnr, st.seq, TRIGGER_INVOKED)
  return true
end

--- Start ghost text in a buffer for a client.
--- @param is_enabled fun(): boolean
function M.attach(bufnr, client_id, opts, is_enabled)
  if buffers[bufnr] then
    buffers[bufnr].client_id = client_id
    return
  end
  local st = { client_id = client_id, opts = opts, timer = uv.new_timer(), seq = 0, typed = '', is_enabled = is_enabled }
  buffers[bufnr] = st
  local group = api.nvim_create_augroup('kspec.ghost.' .. bufnr, { clear = true })
  api.nvim_create_autocmd('TextChangedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      on_text_changed(bufnr)
    end,
  })
  api.nvim_create_autocmd('CursorMovedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      on_cursor_moved(bufnr)
    end,
  })
  -- a popup menu (Ctrl-N, omni completion) hides the ghost: its keys and text are the menu's
  api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave', 'CompleteChanged', 'TextChangedP' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.clear(bufnr)
    end,
  })
  api.nvim_create_autocmd({ 'BufUnload', 'BufWipeout' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.detach(bufnr)
    end,
  })
end

function M.detach(bufnr)
  local st = buffers[bufnr]
  if not st then
    return
  end
  M.clear(bufnr)
  if st.timer and not st.timer:is_closing() then
    st.timer:close()
  end
  buffers[bufnr] = nil
  pcall(api.nvim_del_augroup_by_name, 'kspec.ghost.' .. bufnr)
end

--- Internal state, for tests and bug reports.
function M._debug(bufnr)
  local st = buffers[bufnr or api.nvim_get_current_buf()]
  if not st then
    return nil
  end
  return {
    seq = st.seq,
    pending = st.pending ~= nil,
    anchor = st.anchor and { row = st.anchor.row, col = st.anchor.col } or nil,
    typed = st.typed,
    count = st.items and #st.items or 0,
    refreshes = st.refreshes or 0, -- requests asked again by refresh()
    joining = st.join ~= nil, -- next / prev wait for the final alternatives
  }
end

function M.attached(bufnr)
  return buffers[bufnr or api.nvim_get_current_buf()] ~= nil
end

--- Clear every buffer (completions turned off).
function M.clear_all()
  for bufnr in pairs(buffers) do
    M.clear(bufnr)
  end
end

return M
