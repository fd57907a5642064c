-- Next-edit suggestions for Neovim: once an edit settles, the server is asked where the
-- same change is due (fimls/nextEdits); the nearest place is marked (the old text
-- highlighted, the new one beside it). `keymaps.next_edit` jumps there; pressed again on
-- that line it applies the change, and the next place is marked. `keymaps.next_edit_dismiss`
-- (or leaving it) ends the chain, and the server forgets the edit.
local M = {}

M.ns = vim.api.nvim_create_namespace('fimls_next_edit')
M.state = {} -- per buffer: { edit = the nearest edit or nil, pending = request id }
local SETTLE_MS = 300

local function client_for(buf)
  return vim.lsp.get_clients({ bufnr = buf, name = 'fimls' })[1]
end

-- The byte column of an LSP position on its line.
local function byte_col(buf, line, character, encoding)
  local text = vim.api.nvim_buf_get_lines(buf, line, line + 1, false)[1] or ''
  local ok, col = pcall(vim.str_byteindex, text, encoding, character, false)
  if ok then return col end
  return math.min(character, #text)
end

function M.clear(buf)
  vim.api.nvim_buf_clear_namespace(buf, M.ns, 0, -1)
  local st = M.state[buf]
  if st then st.edit = nil end
end

local function show(buf, edit, encoding)
  M.clear(buf)
  M.state[buf].edit = edit
  local r = edit.range
  local s = byte_col(buf, r.start.line, r.start.character, encoding)
  local e = byte_col(buf, r['end'].line, r['end'].character, encoding)
  vim.api.nvim_buf_set_extmark(buf, M.ns, r.start.line, s, {
    end_row = r['end'].line, end_col = e, hl_group = 'FimlsNextEditOld',
    virt_text = { { ' → ' .. edit.newText, 'FimlsNextEdit' } }, virt_text_pos = 'eol',
  })
end

--- Ask the server for the edit's next places; mark the nearest.
function M.ask(buf)
  local client = client_for(buf)
  if not client or not vim.api.nvim_buf_is_valid(buf) then return end
  local st = M.state[buf] or {}
  M.state[buf] = st
  if st.pending then client:cancel_request(st.pending) end
  local uri = vim.uri_from_bufnr(buf)
  local tick = vim.api.nvim_buf_get_changedtick(buf)
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.textDocument = { uri = uri }
  local ok, id = client:request('fimls/nextEdits', params, function(err, result, ctx)
    if st.pending == ctx.request_id then st.pending = nil end
    if err or not result or not vim.api.nvim_buf_is_valid(buf)
        or vim.api.nvim_buf_get_changedtick(buf) ~= tick then return end
    for _, edit in ipairs(result.edits or {}) do
      if edit.textDocument.uri == uri then
        show(buf, edit, client.offset_encoding)
        return
      end
    end
    M.clear(buf)
  end, buf)
  if ok then st.pending = id end
end

--- The key: jump to the marked place, or apply it when the cursor is on its line.
--- Returns false when nothing is marked.
function M.go(buf)
  buf = buf or vim.api.nvim_get_current_buf()
  local st = M.state[buf]
  local edit = st and st.edit
  local client = client_for(buf)
  if not edit or not client then return false end
  local r = edit.range
  if vim.api.nvim_win_get_cursor(0)[1] - 1 ~= r.start.line then
    local col = byte_col(buf, r.start.line, r.start.character, client.offset_encoding)
    vim.api.nvim_win_set_cursor(0, { r.start.line + 1, col })
    return true
  end
  M.clear(buf)
  -- The edit is a change like any other: once it settles, the next place is asked for.
  vim.lsp.util.apply_text_edits({ { range = r, newText = edit.newText } }, buf,
    client.offset_encoding)
  return true
end

--- End the chain: no mark, and the server forgets the edit.
function M.dismiss(buf)
  buf = buf or vim.api.nvim_get_current_buf()
  local had = M.state[buf] and M.state[buf].edit
  M.clear(buf)
  local client = client_for(buf)
  if client then
    client:notify('fimls/dismissNextEdits', { textDocument = { uri = vim.uri_from_bufnr(buf) } })
  end
  return had ~= nil
end

--- Ask after each edit settles; map the keys (normal and insert mode).
function M.attach(buf, keymaps)
  local g = vim.api.nvim_create_augroup('fimls_next_edit_' .. buf, { clear = true })
  local timer = (vim.uv or vim.loop).new_timer()
  M.state[buf] = M.state[buf] or {}
  vim.api.nvim_create_autocmd({ 'TextChanged', 'TextChangedI' }, { group = g, buffer = buf,
    callback = function()
      M.clear(buf)
      timer:stop()
      timer:start(SETTLE_MS, 0, vim.schedule_wrap(function() M.ask(buf) end))
    end })
  vim.api.nvim_create_autocmd('BufWipeout', { group = g, buffer = buf, callback = function()
    timer:stop()
    timer:close()
    M.state[buf] = nil
  end })
  for lhs, fn in pairs({ [keymaps.next_edit or ''] = M.go,
                         [keymaps.next_edit_dismiss or ''] = M.dismiss }) do
    if lhs ~= '' then
      vim.keymap.set({ 'n', 'i' }, lhs, function()
        if not fn(buf) then
          vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(lhs, true, false, true), 'n', false)
        end
      end, { buffer = buf, desc = 'fimls: next edit' })
    end
  end
end

return M
