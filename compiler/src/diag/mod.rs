//! The diagnostics model shared by every front door: a stable code, a severity,
//! a message, a primary span, labelled secondary spans and an optional help line.
//! Rendering lives in `render` (ariadne for terminals, JSON lines for tools).

pub mod codes;
pub mod render;

use crate::syntax::span::Span;

/// `` a `x` `` or `` an `x` ``: a name in backticks with its article.
pub fn a_code(x: impl std::fmt::Display) -> String {
    with_article(&format!("`{x}`"))
}

/// `noun` after "a" or "an", by how its first word is read: a dtype name
/// letter by letter ("an f32 tensor", "an i8", "a u8", "a bf16"), another word
/// as spelled ("an int", "a float"); `None` takes no article.
pub fn with_article(noun: &str) -> String {
    let first = noun
        .trim_start_matches('`')
        .split([' ', '[', '(', '`'])
        .next()
        .unwrap_or("");
    let is_dtype = crate::check::types::DType::from_name(first).is_some();
    let an = match first.as_bytes().first() {
        _ if first == "None" => return noun.to_string(),
        Some(b'f' | b'i') if is_dtype => true,
        Some(_) if is_dtype => false,
        Some(c) => matches!(c.to_ascii_lowercase(), b'a' | b'e' | b'i' | b'o'),
        None => false,
    };
    format!("{} {noun}", if an { "an" } else { "a" })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
    /// Information that needs no action (`note[W0006]`): shown, never counted
    /// as a warning, an LSP `Information`.
    Note,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        }
    }
}

/// A secondary span with its message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Label {
    pub span: Span,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Diagnostic {
    /// Stable code from `codes::CATALOGUE`, e.g. `"E0401"`.
    pub code: &'static str,
    pub severity: Severity,
    pub message: String,
    /// Primary span, and the message printed under it (may be empty).
    pub span: Span,
    pub primary_label: String,
    pub labels: Vec<Label>,
    pub help: Option<String>,
}

impl Diagnostic {
    /// A diagnostic whose severity comes from its code's catalogue entry.
    pub fn new(code: &'static str, span: Span, message: impl Into<String>) -> Self {
        let severity = codes::lookup(code)
            .map(|c| c.severity)
            .unwrap_or(Severity::Error);
        debug_assert!(
            codes::lookup(code).is_some(),
            "unknown diagnostic code {code}"
        );
        Diagnostic {
            code,
            severity,
            message: message.into(),
            span,
            primary_label: String::new(),
            labels: Vec::new(),
            help: None,
        }
    }

    pub fn with_primary_label(mut self, message: impl Into<String>) -> Self {
        self.primary_label = message.into();
        self
    }

    pub fn with_label(mut self, span: Span, message: impl Into<String>) -> Self {
        self.labels.push(Label {
            span,
            message: message.into(),
        });
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The same diagnostic with every span moved by `by` bytes (item-relative → file).
    pub fn shifted(mut self, by: u32) -> Self {
        self.span = self.span.shift(by);
        for l in &mut self.labels {
            l.span = l.span.shift(by);
        }
        self
    }
}

#[cfg(test)]
mod article_tests {
    use super::with_article;

    #[test]
    fn dtypes_are_read_as_letters() {
        for (noun, want) in [
            ("i32 tensor", "an i32 tensor"),
            ("f32", "an f32"),
            ("f8e4m3 scalar parameter", "an f8e4m3 scalar parameter"),
            ("u8 tensor", "a u8 tensor"),
            ("bf16 tensor", "a bf16 tensor"),
            ("bool", "a bool"),
            ("int", "an int"),
            ("float", "a float"),
            ("Tensor[3, f32]", "a Tensor[3, f32]"),
            ("tuple of 2", "a tuple of 2"),
            ("None", "None"),
            ("`i8` tensor", "an `i8` tensor"),
            ("`bf16`", "a `bf16`"),
        ] {
            assert_eq!(with_article(noun), want);
        }
    }
}
