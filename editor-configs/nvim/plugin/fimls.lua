-- Loaded with the plugin; nothing starts until require('fimls').setup() is called, so a
-- user's own vim.lsp configuration is never overridden behind their back.
if vim.fn.has('nvim-0.11') == 0 then
  vim.notify('fimls needs Neovim >= 0.11', vim.log.levels.WARN)
end
