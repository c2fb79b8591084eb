//! `textDocument/documentSymbol`: the file's kernels, functions, constants,
//! imports and top-level variables (`tessera::ide::document_symbols`).

use tessera::ide;
use tower_lsp::jsonrpc::Result;
use tower_lsp::lsp_types::{
    DocumentSymbol, DocumentSymbolParams, DocumentSymbolResponse, SymbolKind,
};

use crate::position::LineIndex;
use crate::server::Backend;

impl Backend {
    pub(crate) async fn handle_document_symbol(
        &self,
        params: DocumentSymbolParams,
    ) -> Result<Option<DocumentSymbolResponse>> {
        self.on_snapshot("documentSymbol", None, move |s| {
            use tessera::ide::SymbolKind as K;
            let Some(file) = s.file(&params.text_document.uri) else {
                return Ok(None);
            };
            let ix = LineIndex::new(file.text(&s.db));
            #[allow(deprecated)]
            let symbols = ide::document_symbols(&s.db, file, s.options)
                .into_iter()
                .map(|sym| DocumentSymbol {
                    name: sym.name,
                    detail: sym
                        .detail
                        .or_else(|| (sym.kind == K::Kernel).then(|| "kernel".into())),
                    kind: match sym.kind {
                        K::Kernel | K::Function => SymbolKind::FUNCTION,
                        K::Const => SymbolKind::CONSTANT,
                        K::Module => SymbolKind::MODULE,
                        K::Variable => SymbolKind::VARIABLE,
                    },
                    tags: None,
                    deprecated: None,
                    range: ix.range(sym.span.start, sym.span.end),
                    selection_range: ix.range(sym.name_span.start, sym.name_span.end),
                    children: None,
                })
                .collect();
            Ok(Some(DocumentSymbolResponse::Nested(symbols)))
        })
        .await
    }
}
