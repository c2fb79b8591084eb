//! The abstract syntax tree of a `.tsr` file.
//!
//! A file is split into top-level items (see `syntax::split`), and each item is
//! parsed on its own: every span inside an item is relative to the start of that
//! item's text. Nodes keep the source distinctions a checker or editor needs
//! (keyword arguments, slices, decorators, docstrings) and nothing more.

use super::span::Span;

/// An identifier with its span.
#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

impl Ident {
    pub fn new(name: impl Into<String>, span: Span) -> Self {
        Ident {
            name: name.into(),
            span,
        }
    }
}

/// One top-level item.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    /// `import std.linalg` / `import std.linalg as la`
    Import(Import),
    /// `from std.nn import softmax, layer_norm as ln`
    FromImport(FromImport),
    /// `const BLOCK = 1024` / `const BLOCK: i32 = 1024`
    Const(ConstItem),
    /// `def` with optional decorators (`@kernel`, `@autotune`).
    Function(Function),
    /// A statement at top level: scripts, `tessera run` and the REPL execute these.
    Stmt(Stmt),
}

impl Item {
    pub fn span(&self) -> Span {
        match self {
            Item::Import(i) => i.span,
            Item::FromImport(i) => i.span,
            Item::Const(c) => c.span,
            Item::Function(f) => f.span,
            Item::Stmt(s) => s.span,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Import {
    /// Dotted module path: `std.linalg` is `[std, linalg]`.
    pub path: Vec<Ident>,
    pub alias: Option<Ident>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FromImport {
    pub module: Vec<Ident>,
    pub names: Vec<ImportName>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ImportName {
    pub name: Ident,
    pub alias: Option<Ident>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ConstItem {
    pub name: Ident,
    pub ty: Option<TypeExpr>,
    pub value: Expr,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub decorators: Vec<Decorator>,
    pub name: Ident,
    /// `def f[T: float](...)`: the dtype variables the signature names.
    pub type_params: Vec<TypeParam>,
    pub params: Vec<Param>,
    pub ret: Option<TypeExpr>,
    /// The string literal that opens the body, if any (it is also kept in `body`).
    pub docstring: Option<String>,
    pub body: Vec<Stmt>,
    /// From the first decorator (or `def`) to the end of the body.
    pub span: Span,
    /// The `def NAME(...) -> T:` header, for editors (inlay hints, hovers).
    pub header_span: Span,
}

impl Function {
    pub fn decorator(&self, name: &str) -> Option<&Decorator> {
        self.decorators.iter().find(|d| d.name.name == name)
    }

    pub fn is_kernel(&self) -> bool {
        self.decorator("kernel").is_some()
    }
}

/// `T` or `T: float` in `def f[T: float](...)`: a dtype variable and its bound.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeParam {
    pub name: Ident,
    pub bound: Option<Ident>,
    pub span: Span,
}

/// `@name` or `@name(args...)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Decorator {
    pub name: Ident,
    /// `None` when written without parentheses.
    pub args: Option<Vec<Arg>>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: Ident,
    pub ty: Option<TypeExpr>,
    pub default: Option<Expr>,
    pub span: Span,
}

/// A type annotation.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeExpr {
    pub kind: TypeExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TypeExprKind {
    /// A bare name: a dtype (`f32`, `bool`) or an unknown name the checker reports.
    Name(Ident),
    /// `Tensor[...]`, `Tile[...]`: dims then the dtype, each an expression
    /// (string literals hold dim expressions such as `"4*D"`; see `syntax::dim`).
    Generic { base: Ident, args: Vec<Expr> },
    /// `const` alone, or `const T` (`const bool`, `const i32`).
    Const(Option<Box<TypeExpr>>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    pub kind: StmtKind,
    pub span: Span,
}

pub type Block = Vec<Stmt>;

#[derive(Clone, Debug, PartialEq)]
pub enum StmtKind {
    /// An expression evaluated for its effect (or, in the REPL, its value).
    Expr(Expr),
    /// `target = value` or `target: T = value`. Targets are names, tuples of
    /// targets, subscripts or attributes; the parser rejects anything else.
    Assign {
        target: Expr,
        ty: Option<TypeExpr>,
        value: Expr,
    },
    /// `target op= value`
    AugAssign {
        target: Expr,
        op: BinOp,
        value: Expr,
    },
    /// `if c: ... elif c2: ... else: ...` — `branches` holds the `if` and each `elif`.
    If {
        branches: Vec<(Expr, Block)>,
        orelse: Option<Block>,
    },
    /// `for target in iter:` (`iter` is usually `range(...)`).
    For {
        target: Ident,
        iter: Expr,
        body: Block,
    },
    While {
        cond: Expr,
        body: Block,
    },
    Return(Option<Expr>),
    Break,
    Continue,
    Pass,
    /// A statement the parser could not read; its error is already reported.
    Error,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

impl Expr {
    pub fn new(kind: ExprKind, span: Span) -> Self {
        Expr { kind, span }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Int(i64),
    /// Float literals, including `inf`.
    Float(f64),
    Str(String),
    Bool(bool),
    None,
    Name(Ident),
    Unary {
        op: UnaryOp,
        operand: Box<Expr>,
    },
    Binary {
        op: BinOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    /// `then if cond else otherwise`
    IfElse {
        cond: Box<Expr>,
        then: Box<Expr>,
        otherwise: Box<Expr>,
    },
    /// `func(args)`; a launch with a grid is `Call { func: Subscript { kernel, [grid] } }`.
    Call {
        func: Box<Expr>,
        args: Vec<Arg>,
    },
    /// `value[i, a:b, :, None]`
    Subscript {
        value: Box<Expr>,
        indices: Vec<Index>,
    },
    /// `value.attr` (`.T`, `.shape`, `.dtype`, and method calls through `Call`).
    Attribute {
        value: Box<Expr>,
        attr: Ident,
    },
    /// `(a, b)` (also `a, b` where a tuple is allowed)
    Tuple(Vec<Expr>),
    /// `[a, b]`
    List(Vec<Expr>),
    /// `{k: v, ...}` (used by `@autotune(space=...)`)
    Dict(Vec<(Expr, Expr)>),
    /// An expression the parser could not read; its error is already reported.
    Error,
}

/// A call argument, positional or `name=value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
    pub span: Span,
}

/// One position inside `[...]`.
#[derive(Clone, Debug, PartialEq)]
pub enum Index {
    /// An expression: an integer index, `None` (new axis), or a tile index.
    Expr(Expr),
    /// `start : end` or `start : end : step`, each part optional (`:` alone).
    Slice {
        start: Option<Expr>,
        end: Option<Expr>,
        step: Option<Expr>,
        span: Span,
    },
}

impl Index {
    pub fn span(&self) -> Span {
        match self {
            Index::Expr(e) => e.span,
            Index::Slice { span, .. } => *span,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `+x`
    Pos,
    /// `not x`
    Not,
    /// `~x`
    Invert,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Mod,
    Pow,
    /// `@`
    MatMul,
    BitAnd,
    BitOr,
    BitXor,
    And,
    Or,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::FloorDiv => "//",
            BinOp::Mod => "%",
            BinOp::Pow => "**",
            BinOp::MatMul => "@",
            BinOp::BitAnd => "&",
            BinOp::BitOr => "|",
            BinOp::BitXor => "^",
            BinOp::And => "and",
            BinOp::Or => "or",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
        }
    }

    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
        )
    }
}

impl UnaryOp {
    pub fn symbol(self) -> &'static str {
        match self {
            UnaryOp::Neg => "-",
            UnaryOp::Pos => "+",
            UnaryOp::Not => "not ",
            UnaryOp::Invert => "~",
        }
    }
}
