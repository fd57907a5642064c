-- fimls for Neovim >= 0.11: starts `fimls serve` with vim.lsp, shows inline completions as
-- ghost text and reports what happened to each suggestion (shown, accepted, partially
-- accepted, dismissed) so that `fimls stats` can tell whether suggestions help.
--
-- On 0.12+ the built-in vim.lsp.inline_completion can draw the ghost text
-- (`builtin_ui = true`); on 0.11 (no built-in UI) this plugin draws it with extmarks.
--
-- Switches: `enabled` per filetype ('*' plus overrides), :FimlsToggle [filetype] and
-- :FimlsSnooze [minutes]; a disabled buffer sends no request. `trigger_mode = 'manual'`
-- asks only on `keymaps.trigger` (the server's triggerMode is set to match).
-- Next edits (lua/fimls/nextedit.lua): after an edit, where the same change is due.
local M = {}

local defaults = {
  cmd = { 'fimls', 'serve' },
  filetypes = nil, -- nil: every buffer with a file type
  root_markers = { '.git' },
  init_options = {}, -- fimls options, camelCase (maxTokens, model, ...): docs/options.md
  -- Suggestions per filetype; '*' is every filetype not named.
  enabled = { ['*'] = true, markdown = false, text = false, gitcommit = false },
  trigger_mode = 'auto', -- 'manual': only on keymaps.trigger
  -- nil: the built-in vim.lsp.inline_completion where it exists (0.12+), else our extmarks.
  -- The built-in UI runs the item's command on accept (logged) but reports no shown or
  -- dismissed events; set false to keep this plugin's UI on 0.12 too.
  builtin_ui = nil,
  keymaps = {
    accept = '<Tab>',
    accept_word = '<M-Right>',
    accept_line = '<M-Down>',
    dismiss = '<C-]>',
    trigger = '<M-\\>', -- ask now (in manual mode, the only way to ask): up to 3 items
    next = '<M-]>', -- the next of those items (their first lines differ)
    next_edit = '<M-n>', -- jump to the marked next edit; on its line, apply it
    next_edit_dismiss = '<M-N>', -- end the chain of next edits
  },
  next_edits = true, -- after an edit, mark where the same change is due (fimls/nextEdits)
  hl_group = 'FimlsGhost',
}

M.config = vim.deepcopy(defaults)
M.ns = vim.api.nvim_create_namespace('fimls_ghost')
-- Per buffer: { item = {text, row, col, request_id, accepted}, pending = request id }
M.state = {}
M.on = true -- :FimlsToggle
M.snoozed_until = 0 -- :FimlsSnooze, in os.time() seconds

local function client_for(buf)
  return vim.lsp.get_clients({ bufnr = buf, name = 'fimls' })[1]
end

local function notify(buf, method, params)
  local client = client_for(buf)
  if client then client:notify(method, params) end
end

-- Length of `text` in the client's position encoding (what LSP positions count).
local function units(text, encoding)
  if encoding == 'utf-8' then return #text end
  local ok, n = pcall(vim.str_utfindex, text, encoding == 'utf-32' and 'utf-32' or 'utf-16')
  if ok then return n end
  return #text
end

local function clear(buf)
  if vim.api.nvim_buf_is_valid(buf) then
    vim.api.nvim_buf_clear_namespace(buf, M.ns, 0, -1)
  end
  local st = M.state[buf]
  if st then st.item = nil end
end

local function show(buf, item)
  vim.api.nvim_buf_clear_namespace(buf, M.ns, 0, -1)
  local lines = vim.split(item.text, '\n', { plain = true })
  local opts = { virt_text = { { lines[1], M.config.hl_group } }, virt_text_pos = 'inline' }
  if #lines > 1 then
    local extra = {}
    for i = 2, #lines do extra[#extra + 1] = { { lines[i], M.config.hl_group } } end
    opts.virt_lines = extra
  end
  vim.api.nvim_buf_set_extmark(buf, M.ns, item.row, item.col, opts)
end

--- Dismiss the suggestion shown in `buf` (and tell the server).
function M.dismiss(buf)
  buf = buf or vim.api.nvim_get_current_buf()
  local st = M.state[buf]
  if st and st.item then
    if (st.item.accepted or 0) == 0 then
      notify(buf, 'fimls/didDismiss', { requestId = st.item.request_id })
    end
    clear(buf)
    return true
  end
  return false
end

-- Insert `part` of the current suggestion at the cursor and keep showing the rest.
local function accept_part(buf, part)
  local st = M.state[buf]
  local it = st and st.item
  if not it or part == '' then return false end
  local lines = vim.split(part, '\n', { plain = true })
  vim.api.nvim_buf_set_text(buf, it.row, it.col, it.row, it.col, lines)
  local row = it.row + #lines - 1
  local col = (#lines == 1) and (it.col + #lines[1]) or #lines[#lines]
  local client = client_for(buf)
  local enc = client and client.offset_encoding or 'utf-16'
  it.accepted = (it.accepted or 0) + units(part, enc)
  local rest = it.text:sub(#part + 1)
  it.text, it.row, it.col = rest, row, col
  st.expect = { row = row, col = col, tick = vim.api.nvim_buf_get_changedtick(buf) }
  vim.api.nvim_win_set_cursor(0, { row + 1, col })
  if rest == '' then
    -- Everything taken: run the item's command (the server logs "accepted").
    if client and it.command then
      client:exec_cmd(it.command, { bufnr = buf })
    else
      notify(buf, 'fimls/didAccept', { requestId = it.request_id, index = (it.index or 1) - 1 })
    end
    clear(buf)
  else
    notify(buf, 'fimls/didPartiallyAccept', { requestId = it.request_id, acceptedLength = it.accepted })
    show(buf, it)
  end
  return true
end

-- Accept the part of the shown suggestion that `pick` chooses from its text.
local function accept_with(buf, pick)
  buf = buf or vim.api.nvim_get_current_buf()
  local st = M.state[buf]
  if not (st and st.item) then return false end
  return accept_part(buf, pick(st.item.text))
end

--- Accept the whole suggestion.
function M.accept(buf)
  return accept_with(buf, function(t) return t end)
end

--- Accept the next word of the suggestion.
function M.accept_word(buf)
  return accept_with(buf, function(t)
    return t:match('^%s*[%w_]+') or t:match('^%s*[^%w_%s]') or t:match('^%s+') or t
  end)
end

--- Accept the suggestion up to the end of its current line.
function M.accept_line(buf)
  return accept_with(buf, function(t)
    local nl = t:find('\n', 1, true)
    if nl == 1 then
      local nxt = t:find('\n', 2, true)
      return nxt and t:sub(1, nxt - 1) or t
    end
    return nl and t:sub(1, nl - 1) or t
  end)
end

--- Whether suggestions are on for `buf`: not toggled off, not snoozed, its filetype enabled.
function M.enabled(buf)
  if not M.on or os.time() < M.snoozed_until then return false end
  return M.enabled_filetype(vim.bo[buf or vim.api.nvim_get_current_buf()].filetype)
end

--- Ask the server for a suggestion at the cursor (cancelling the previous request);
--- `invoked`: the user asked (a key), not typing.
function M.request(buf, invoked)
  buf = buf or vim.api.nvim_get_current_buf()
  local client = client_for(buf)
  if not client or not M.enabled(buf) then return false end
  local st = M.state[buf] or {}
  M.state[buf] = st
  if st.pending then
    client:cancel_request(st.pending)
    st.pending = nil
  end
  local win = vim.api.nvim_get_current_win()
  local cursor = vim.api.nvim_win_get_cursor(win)
  local tick = vim.api.nvim_buf_get_changedtick(buf)
  local params = vim.lsp.util.make_position_params(win, client.offset_encoding)
  params.context = { triggerKind = invoked and 1 or 2 } -- Invoked or Automatic
  local ok, id = client:request('textDocument/inlineCompletion', params, function(err, result, ctx)
    if st.pending == ctx.request_id then st.pending = nil end
    if err or not result or not vim.api.nvim_buf_is_valid(buf) then return end
    local items = result.items or result
    local now = vim.api.nvim_win_get_cursor(0)
    -- Stale: the user typed on or moved since the request was sent.
    if not items[1] or vim.api.nvim_buf_get_changedtick(buf) ~= tick
        or now[1] ~= cursor[1] or now[2] ~= cursor[2] or vim.fn.mode() ~= 'i' then
      return
    end
    local choices = {}
    for _, it in ipairs(items) do
      local text = it.insertText
      if type(text) == 'table' then text = text.value end
      if text and text ~= '' then choices[#choices + 1] = { text = text, command = it.command } end
    end
    if not choices[1] then return end
    local cmd = choices[1].command
    local rid = cmd and cmd.arguments and cmd.arguments[1] or tostring(ctx.request_id)
    st.item = { text = choices[1].text, row = cursor[1] - 1, col = cursor[2], request_id = rid,
                command = cmd, accepted = 0, choices = choices, index = 1 }
    st.expect = nil
    show(buf, st.item)
    notify(buf, 'fimls/didShowCompletion', { requestId = rid })
  end, buf)
  if ok then st.pending = id end
  return true
end

--- Show the next of the items an explicit request got (before any of it was accepted).
function M.next(buf)
  buf = buf or vim.api.nvim_get_current_buf()
  local st = M.state[buf]
  local it = st and st.item
  if not it or not it.choices or #it.choices < 2 or (it.accepted or 0) > 0 then return false end
  it.index = it.index % #it.choices + 1
  it.text, it.command = it.choices[it.index].text, it.choices[it.index].command
  show(buf, it)
  return true
end

-- The built-in UI (0.12+) follows the switches buffer by buffer.
local function sync_builtin()
  if not M.builtin then return end
  for _, c in ipairs(vim.lsp.get_clients({ name = 'fimls' })) do
    for buf in pairs(c.attached_buffers or {}) do
      vim.lsp.inline_completion.enable(M.enabled(buf), { bufnr = buf })
    end
  end
end

local function dismiss_all()
  for buf in pairs(M.state) do
    if vim.api.nvim_buf_is_valid(buf) then M.dismiss(buf) end
  end
end

--- Whether `ft` is enabled by the `enabled` table.
function M.enabled_filetype(ft)
  local tbl = M.config.enabled or {}
  if tbl[ft] ~= nil then return tbl[ft] and true or false end
  return tbl['*'] ~= false
end

--- Turn suggestions off or on: everywhere, or for `filetype`.
function M.toggle(filetype)
  local what, on
  if filetype and filetype ~= '' then
    on = not M.enabled_filetype(filetype)
    M.config.enabled[filetype] = on
    what = filetype
  else
    M.on = not M.on
    M.snoozed_until = 0
    what, on = 'everywhere', M.on
  end
  dismiss_all()
  sync_builtin()
  vim.notify(('fimls: %s %s'):format(on and 'on' or 'off', what))
end

--- No suggestions for `minutes` (30 by default).
function M.snooze(minutes)
  minutes = tonumber(minutes) or 30
  M.snoozed_until = os.time() + math.floor(minutes * 60)
  dismiss_all()
  sync_builtin()
  vim.defer_fn(sync_builtin, math.floor(minutes * 60000) + 100)
  vim.notify(('fimls: snoozed for %g minutes'):format(minutes))
end

local function map(buf, lhs, fn, fallback)
  if not lhs or lhs == '' then return end
  vim.keymap.set('i', lhs, function()
    if not fn(buf) then
      vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(fallback or lhs, true, false, true), 'n', false)
    end
  end, { buffer = buf, desc = 'fimls' })
end

--- Attach the ghost-text UI (0.11 path) to a buffer.
function M.attach(buf)
  if M.state[buf] and M.state[buf].attached then return end
  M.state[buf] = M.state[buf] or {}
  M.state[buf].attached = true
  local g = vim.api.nvim_create_augroup('fimls_buf_' .. buf, { clear = true })
  vim.api.nvim_create_autocmd('TextChangedI', { group = g, buffer = buf, callback = function()
    local st = M.state[buf]
    local tick = vim.api.nvim_buf_get_changedtick(buf)
    if st.expect and st.expect.tick == tick then return end -- our own insertion
    if st.item then M.dismiss(buf) end
    if M.config.trigger_mode ~= 'manual' then M.request(buf) end
  end })
  vim.api.nvim_create_autocmd('InsertLeave', { group = g, buffer = buf, callback = function()
    M.dismiss(buf)
  end })
  vim.api.nvim_create_autocmd('CursorMovedI', { group = g, buffer = buf, callback = function()
    local st = M.state[buf]
    if not (st and st.item) then return end
    local c = vim.api.nvim_win_get_cursor(0)
    if c[1] - 1 ~= st.item.row or c[2] ~= st.item.col then M.dismiss(buf) end
  end })
  -- Where the cursor rests (the file opened at a line, a jump, a search hit) goes to the
  -- server, which evaluates the prompt there while the user reads.
  local rest = (vim.uv or vim.loop).new_timer()
  local function report_cursor()
    rest:stop()
    rest:start(250, 0, vim.schedule_wrap(function()
      if not vim.api.nvim_buf_is_valid(buf) or vim.api.nvim_get_current_buf() ~= buf then return end
      local client = client_for(buf)
      if not client then return end
      client:notify('fimls/cursor', vim.lsp.util.make_position_params(0, client.offset_encoding))
    end))
  end
  vim.api.nvim_create_autocmd({ 'CursorMoved', 'BufEnter' }, { group = g, buffer = buf,
    callback = report_cursor })
  vim.api.nvim_create_autocmd('BufWipeout', { group = g, buffer = buf, callback = function()
    rest:stop()
    rest:close()
  end })
  report_cursor()
  local k = M.config.keymaps
  map(buf, k.accept, M.accept, '<Tab>')
  map(buf, k.accept_word, M.accept_word)
  map(buf, k.accept_line, M.accept_line)
  map(buf, k.dismiss, M.dismiss)
  map(buf, k.trigger, function(b) return M.request(b, true) end)
  map(buf, k.next, M.next)
end

--- Show `fimls stats` for the latency log in a scratch window.
function M.stats(log_path)
  local cmd = { M.config.cmd[1], 'stats' }
  local path = log_path or (M.config.init_options or {}).latencyLog
  if path and path ~= '' then cmd[#cmd + 1] = path end
  local res = vim.system(cmd, { text = true }):wait()
  local out = (res.stdout or '') .. (res.stderr or '')
  local buf = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, vim.split(out, '\n', { plain = true }))
  vim.bo[buf].bufhidden = 'wipe'
  vim.cmd('botright split')
  vim.api.nvim_win_set_buf(0, buf)
  return out
end

--- Configure and enable fimls. `opts` overrides the defaults above.
function M.setup(opts)
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(defaults), opts or {})
  if M.config.init_options.triggerMode == nil then
    M.config.init_options.triggerMode = M.config.trigger_mode
  end
  vim.api.nvim_set_hl(0, 'FimlsGhost', { link = 'Comment', default = true })
  vim.api.nvim_set_hl(0, 'FimlsNextEdit', { link = 'DiffAdd', default = true })
  vim.api.nvim_set_hl(0, 'FimlsNextEditOld', { link = 'DiffDelete', default = true })
  local lsp_cfg = {
    cmd = M.config.cmd,
    root_markers = M.config.root_markers,
    init_options = M.config.init_options,
    settings = { fimls = M.config.init_options },
  }
  if M.config.filetypes then lsp_cfg.filetypes = M.config.filetypes end
  vim.lsp.config('fimls', lsp_cfg)
  vim.lsp.enable('fimls')
  local builtin = M.config.builtin_ui ~= false and vim.lsp.inline_completion ~= nil
  M.builtin = builtin
  vim.api.nvim_create_autocmd('LspAttach', {
    group = vim.api.nvim_create_augroup('fimls_attach', { clear = true }),
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if not client or client.name ~= 'fimls' then return end
      if M.config.next_edits then require('fimls.nextedit').attach(args.buf, M.config.keymaps) end
      if builtin then
        vim.lsp.inline_completion.enable(M.enabled(args.buf), { bufnr = args.buf })
        vim.keymap.set('i', M.config.keymaps.accept, function()
          if not vim.lsp.inline_completion.get() then return '<Tab>' end
        end, { expr = true, buffer = args.buf, desc = 'fimls: accept' })
      else
        M.attach(args.buf)
      end
    end,
  })
  vim.api.nvim_create_user_command('FimlsToggle', function(c) M.toggle(c.args) end,
    { nargs = '?', complete = 'filetype', desc = 'fimls: suggestions off or on (everywhere, or for a filetype)' })
  vim.api.nvim_create_user_command('FimlsSnooze', function(c) M.snooze(c.args) end,
    { nargs = '?', desc = 'fimls: no suggestions for [minutes] (30)' })
  vim.api.nvim_create_user_command('FimlsStats', function(c)
    M.stats(c.args ~= '' and c.args or nil)
  end, { nargs = '?', complete = 'file', desc = 'fimls: latency and acceptance summary' })
end

return M
