-- Test config for headless Neovim: the fimls plugin from this checkout, nothing else.
vim.g.loaded_python3_provider = 0
local root = os.getenv('FIMLS_ROOT')
vim.opt.rtp:prepend(root .. '/editor-configs/nvim')
vim.g.fimls_ready = false
vim.api.nvim_create_autocmd('LspProgress', { callback = function(ev)
  local v = ev.data and ev.data.params and ev.data.params.value
  if v and v.kind == 'end' then vim.g.fimls_ready = true end
end })
-- FIMLS_SETUP: JSON merged into the setup() options (the switch tests).
local extra = os.getenv('FIMLS_SETUP')
require('fimls').setup(vim.tbl_deep_extend('force', {
  cmd = { os.getenv('FIMLS_PYTHON'), '-m', 'fimls', 'serve', '--latency-log', os.getenv('FIMLS_LOG'),
          '--min-confidence', '0' },
  filetypes = { 'python' },
  root_markers = { '.git', 'sample.py' },
  init_options = { maxTokens = 32 },
}, extra and vim.json.decode(extra) or {}))
