-- Headless Neovim as a client of `tessera lsp` (see check.sh): opens a `.tsr`
-- file, waits for the server's diagnostics and writes them, one per line, as
-- `LINE:COL CODE SEVERITY MESSAGE` (1-based, the message's first line) to
-- $NVIM_LSP_OUT, then quits. Works with Neovim 0.7 (vim.lsp.start_client) and
-- later (vim.lsp.start).
local tessera = os.getenv('TESSERA') or 'tessera'
local out_path = assert(os.getenv('NVIM_LSP_OUT'), 'NVIM_LSP_OUT is not set')

vim.cmd('autocmd BufRead,BufNewFile *.tsr setfiletype tessera')

local function finish(lines)
  local f = assert(io.open(out_path, 'w'))
  f:write(table.concat(lines, '\n'), '\n')
  f:close()
  vim.cmd('qa!')
end

local severities = { 'error', 'warning', 'info', 'hint' }

local function report(bufnr)
  local lines = {}
  for _, d in ipairs(vim.diagnostic.get(bufnr)) do
    local code = d.code
    if code == nil and d.user_data and d.user_data.lsp then
      code = d.user_data.lsp.code
    end
    local message = vim.split(d.message, '\n')[1]
    table.insert(lines, string.format('%d:%d %s %s %s', d.lnum + 1, d.col + 1, tostring(code),
      severities[d.severity] or '?', message))
  end
  return lines
end

local function attach(bufnr)
  local config = {
    name = 'tessera',
    cmd = { tessera, 'lsp' },
    root_dir = vim.fn.getcwd(),
    init_options = { arch = 'sm_90' },
  }
  if vim.lsp.start then
    vim.lsp.start(config, { bufnr = bufnr })
  else
    local id = vim.lsp.start_client(config)
    vim.lsp.buf_attach_client(bufnr, id)
  end
  -- Poll for the diagnostics (20 s at most).
  local waited = 0
  local timer = vim.loop.new_timer()
  timer:start(100, 100, vim.schedule_wrap(function()
    waited = waited + 100
    local lines = report(bufnr)
    if #lines > 0 or waited >= 20000 then
      timer:stop()
      if #lines == 0 then
        lines = { 'no diagnostics received' }
      end
      finish(lines)
    end
  end))
end

vim.cmd('autocmd FileType tessera lua TesseraAttach(vim.fn.expand("<abuf>") + 0)')
function TesseraAttach(bufnr)
  attach(bufnr)
end
