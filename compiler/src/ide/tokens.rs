//! Semantic tokens: the lexer's tokens classified with what the checker knows
//! (parameters, dims, functions, builtins, modules, dtypes), and comments.

use crate::check::{builtins, DType, Entry};
use crate::db::{module_scope, Db, SourceFile};
use crate::syntax::lexer::{lex, Tok};
use crate::syntax::span::Span;

use super::names::{self, item_at, OccKind};

/// Token types, in the order of the server's legend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Keyword,
    Function,
    Parameter,
    Variable,
    TypeParameter,
    Type,
    Namespace,
    Number,
    String,
    Comment,
    Operator,
    Decorator,
}

impl TokenType {
    pub const ALL: [TokenType; 12] = [
        TokenType::Keyword,
        TokenType::Function,
        TokenType::Parameter,
        TokenType::Variable,
        TokenType::TypeParameter,
        TokenType::Type,
        TokenType::Namespace,
        TokenType::Number,
        TokenType::String,
        TokenType::Comment,
        TokenType::Operator,
        TokenType::Decorator,
    ];
}

/// One classified token (absolute span); `builtin` marks the default library.
#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    pub span: Span,
    pub ty: TokenType,
    pub builtin: bool,
    pub declaration: bool,
}

/// The semantic tokens of `file`, in order, not overlapping.
pub fn semantic_tokens(db: &dyn Db, file: SourceFile) -> Vec<Token> {
    let text = file.text(db);
    let scope = module_scope(db, file);
    let lexed = lex(text);
    let mut out = Vec::new();
    let mut prev: Option<Tok> = None;
    // Occurrences of the current item, cached while tokens stay in it.
    // Per item: its span, its occurrences by start offset (relative to the
    // item) and how each local is first bound — looked up once per name token,
    // so a long item stays linear.
    type ItemNames = (
        u32,
        u32,
        std::collections::HashMap<u32, names::Occurrence>,
        std::collections::HashMap<String, OccKind>,
    );
    let mut current: Option<ItemNames> = None;
    let toks = &lexed.tokens;
    for (k, (start, tok, end)) in toks.iter().enumerate() {
        let span = Span::new(*start, *end);
        let next = toks.get(k + 1).map(|t| t.1);
        let mut declaration = false;
        let mut builtin = false;
        let ty = match tok {
            Tok::Def
            | Tok::Return
            | Tok::If
            | Tok::Elif
            | Tok::Else
            | Tok::For
            | Tok::In
            | Tok::While
            | Tok::Break
            | Tok::Continue
            | Tok::Pass
            | Tok::Import
            | Tok::From
            | Tok::As
            | Tok::And
            | Tok::Or
            | Tok::Not
            | Tok::Const
            | Tok::True
            | Tok::False
            | Tok::None => Some(TokenType::Keyword),
            Tok::Inf | Tok::Int(_) | Tok::Float(_) => Some(TokenType::Number),
            Tok::Str(_) => Some(TokenType::String),
            Tok::Name(n) => {
                if prev == Some(Tok::At) {
                    Some(TokenType::Decorator)
                } else if prev == Some(Tok::Def) {
                    declaration = true;
                    Some(TokenType::Function)
                } else if DType::from_name(n).is_some() || *n == "Tensor" || *n == "Tile" {
                    builtin = true;
                    Some(TokenType::Type)
                } else {
                    let rel_kind = {
                        let fresh =
                            !matches!(&current, Some((s, e, ..)) if *s <= *start && *start < *e);
                        if fresh {
                            current = item_at(db, file, *start).map(|(item, s)| {
                                let occs = names::item_occurrences(db, item);
                                let mut bound = std::collections::HashMap::new();
                                for (name, kind, _) in names::locals(&occs) {
                                    bound.entry(name).or_insert(kind);
                                }
                                let mut by_start = std::collections::HashMap::new();
                                for o in occs {
                                    by_start.entry(o.span.start).or_insert(o);
                                }
                                (s, s + item.text(db).len() as u32, by_start, bound)
                            });
                        }
                        current.as_ref().and_then(|(s, _, occs, bound)| {
                            let here = occs.get(&(start - s))?;
                            if !here.qualifier.is_empty() {
                                return Some(None);
                            }
                            // A local: how its name is first bound.
                            bound.get(*n).map(|&kind| Some(kind))
                        })
                    };
                    match rel_kind {
                        Some(Some(OccKind::Param)) => Some(TokenType::Parameter),
                        Some(Some(OccKind::Dim)) => Some(TokenType::TypeParameter),
                        Some(Some(_)) => Some(TokenType::Variable),
                        Some(None) => {
                            // A module member: a function when called.
                            if next == Some(Tok::LParen) {
                                Some(TokenType::Function)
                            } else {
                                Some(TokenType::Namespace)
                            }
                        }
                        None => match scope.get(n) {
                            Some(Entry::Function(_)) => Some(TokenType::Function),
                            Some(Entry::Module(_) | Entry::Namespace(_)) => {
                                Some(TokenType::Namespace)
                            }
                            Some(Entry::Const { .. } | Entry::Global(..)) => {
                                Some(TokenType::Variable)
                            }
                            Some(Entry::Broken) => None,
                            None if builtins::is_builtin(n) => {
                                builtin = true;
                                Some(TokenType::Function)
                            }
                            None => Some(TokenType::Variable),
                        },
                    }
                }
            }
            Tok::At
                if matches!(next, Some(Tok::Name(_)))
                    && matches!(prev, None | Some(Tok::Newline | Tok::Indent | Tok::Dedent)) =>
            {
                Some(TokenType::Decorator)
            }
            Tok::Newline | Tok::Indent | Tok::Dedent | Tok::EmptyBlock | Tok::ErrorExpr => None,
            Tok::LParen
            | Tok::RParen
            | Tok::LBracket
            | Tok::RBracket
            | Tok::LBrace
            | Tok::RBrace
            | Tok::Comma
            | Tok::Colon
            | Tok::Dot => None,
            _ => Some(TokenType::Operator),
        };
        if !matches!(tok, Tok::Newline | Tok::Indent | Tok::Dedent) {
            prev = Some(*tok);
        }
        if let Some(ty) = ty {
            if !span.is_empty() {
                out.push(Token {
                    span,
                    ty,
                    builtin,
                    declaration,
                });
            }
        }
    }
    for c in comments(text) {
        out.push(Token {
            span: c,
            ty: TokenType::Comment,
            builtin: false,
            declaration: false,
        });
    }
    out.sort_by_key(|t| t.span.start);
    // Tokens the lexer made of a comment's text never overlap it (comments are
    // skipped by the lexer), but keep the list strictly increasing anyway.
    out.dedup_by(|b, a| b.span.start < a.span.end);
    out
}

/// `# ...` comments (outside string literals), one span per line.
pub fn comments(text: &str) -> Vec<Span> {
    let mut out = Vec::new();
    let mut line_start = 0usize;
    // a `\r\n` splits into two pieces here, which changes nothing for comments
    for line in text.split_inclusive(['\n', '\r']) {
        let mut quote: Option<char> = None;
        let mut escaped = false;
        for (i, c) in line.char_indices() {
            match quote {
                Some(q) => {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == q {
                        quote = None;
                    }
                }
                None if c == '"' || c == '\'' => quote = Some(c),
                None if c == '#' => {
                    let end = line.trim_end_matches(['\n', '\r']).len();
                    out.push(Span::new(
                        (line_start + i) as u32,
                        (line_start + end) as u32,
                    ));
                    break;
                }
                None => {}
            }
        }
        line_start += line.len();
    }
    out
}
