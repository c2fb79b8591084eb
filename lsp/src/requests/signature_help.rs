//! `textDocument/signatureHelp`: the signature of the call around the cursor
//! and its active parameter (`tessera::ide::complete::signature_help`), with
//! parameter labels as UTF-16 offsets into the signature.

use tessera::ide;
use tower_lsp::jsonrpc::Result;
use tower_lsp::lsp_types::{
    Documentation, ParameterInformation, ParameterLabel, SignatureHelp, SignatureHelpParams,
    SignatureInformation,
};

use crate::server::{offset_of, Backend};

impl Backend {
    pub(crate) async fn handle_signature_help(
        &self,
        params: SignatureHelpParams,
    ) -> Result<Option<SignatureHelp>> {
        let p = params.text_document_position_params;
        self.on_snapshot("signatureHelp", None, move |s| {
            let Some(file) = s.file(&p.text_document.uri) else {
                return Ok(None);
            };
            let off = offset_of(s, file, p.position);
            let Some(h) = ide::complete::signature_help(&s.db, file, off) else {
                return Ok(None);
            };
            // Parameter labels as UTF-16 offsets into the label.
            let u16 = |b: usize| h.label[..b].encode_utf16().count() as u32;
            Ok(Some(SignatureHelp {
                signatures: vec![SignatureInformation {
                    label: h.label.clone(),
                    documentation: h.doc.clone().map(Documentation::String),
                    parameters: Some(
                        h.params
                            .iter()
                            .map(|(a, b)| ParameterInformation {
                                label: ParameterLabel::LabelOffsets([u16(*a), u16(*b)]),
                                documentation: None,
                            })
                            .collect(),
                    ),
                    active_parameter: Some(h.active as u32),
                }],
                active_signature: Some(0),
                active_parameter: Some(h.active as u32),
            }))
        })
        .await
    }
}
