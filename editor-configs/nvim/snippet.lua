-- fimls without the plugin: plain vim.lsp (Neovim >= 0.11). Completions arrive through
-- textDocument/inlineCompletion; Neovim 0.12 shows them as ghost text with
-- vim.lsp.inline_completion, 0.11 has no ghost-text UI (use the plugin, or <C-x><C-o>
-- with omnifunc, which uses textDocument/completion).
vim.lsp.config('fimls', {
  cmd = { 'fimls', 'serve' },
  root_markers = { '.git' },
  init_options = { maxTokens = 64 },
})
vim.lsp.enable('fimls')
if vim.lsp.inline_completion then
  vim.lsp.inline_completion.enable()
  vim.keymap.set('i', '<Tab>', function()
    if not vim.lsp.inline_completion.get() then return '<Tab>' end
  end, { expr = true })
end
