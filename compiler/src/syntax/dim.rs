//! Dim expressions: the strings inside `Tensor[...]` / `Tile[...]` types
//! (`"M"`, `"4*D"`, `"M+1"`, `"(M+1)*2"`, `"2*H*D"`).
//!
//! Grammar: integers, names, `+`, `-`, `*`, unary `-`, parentheses, and `//`
//! by a constant (`"N//2"` parses). Normalising to an `Affine` form rejects a
//! product of two non-constant terms (`"M*N"`) and a division that is not exact on
//! every coefficient (`"N//2"` is rejected, `"(2*N)//2"` and `"128//2"` are
//! accepted), since shapes must stay affine in their names. Errors carry a message
//! and a byte offset within the string; the checker reports them as E0111.

use std::collections::BTreeMap;
use std::fmt;

/// A parsed dim expression.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DimExpr {
    Int(i64),
    Name(String),
    Neg(Box<DimExpr>),
    Add(Box<DimExpr>, Box<DimExpr>),
    Sub(Box<DimExpr>, Box<DimExpr>),
    Mul(Box<DimExpr>, Box<DimExpr>),
    FloorDiv(Box<DimExpr>, Box<DimExpr>),
}

/// `constant + sum(coefficient * name)`; terms with a zero coefficient are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Affine {
    pub constant: i64,
    pub terms: BTreeMap<String, i64>,
}

/// A dim string that cannot be used: why, and where (byte offset in the string).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimError {
    pub message: String,
    pub offset: usize,
}

impl fmt::Display for DimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DimError {}

fn err<T>(message: impl Into<String>, offset: usize) -> Result<T, DimError> {
    Err(DimError {
        message: message.into(),
        offset,
    })
}

impl Affine {
    pub fn constant(c: i64) -> Self {
        Affine {
            constant: c,
            terms: BTreeMap::new(),
        }
    }

    pub fn name(n: &str) -> Self {
        let mut terms = BTreeMap::new();
        terms.insert(n.to_string(), 1);
        Affine { constant: 0, terms }
    }

    /// The value when no name occurs.
    pub fn as_const(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.constant)
    }

    /// `Some(name)` when the expression is exactly one name.
    pub fn as_name(&self) -> Option<&str> {
        match (self.constant, self.terms.len()) {
            (0, 1) => self
                .terms
                .iter()
                .next()
                .filter(|(_, &c)| c == 1)
                .map(|(n, _)| n.as_str()),
            _ => None,
        }
    }

    pub fn checked_add(&self, other: &Affine) -> Option<Affine> {
        let mut out = self.clone();
        out.constant = out.constant.checked_add(other.constant)?;
        for (n, &c) in &other.terms {
            let e = out.terms.entry(n.clone()).or_insert(0);
            *e = e.checked_add(c)?;
            if *e == 0 {
                out.terms.remove(n);
            }
        }
        Some(out)
    }

    pub fn checked_scale(&self, k: i64) -> Option<Affine> {
        if k == 0 {
            return Some(Affine::constant(0));
        }
        let mut out = Affine::constant(self.constant.checked_mul(k)?);
        for (n, &c) in &self.terms {
            out.terms.insert(n.clone(), c.checked_mul(k)?);
        }
        Some(out)
    }

    pub fn checked_sub(&self, other: &Affine) -> Option<Affine> {
        self.checked_add(&other.checked_scale(-1)?)
    }

    /// The product, when at least one side is a constant (`None` otherwise or on overflow).
    pub fn checked_mul(&self, other: &Affine) -> Option<Affine> {
        match (self.as_const(), other.as_const()) {
            (Some(k), _) => other.checked_scale(k),
            (_, Some(k)) => self.checked_scale(k),
            _ => None,
        }
    }

    /// Exact floor division by a positive constant: `Some` only when every
    /// coefficient and the constant are multiples of `k` (or everything is constant).
    pub fn exact_div(&self, k: i64) -> Option<Affine> {
        if k <= 0 {
            return None;
        }
        if let Some(c) = self.as_const() {
            return Some(Affine::constant(c.div_euclid(k)));
        }
        if self.constant % k != 0 || self.terms.values().any(|c| c % k != 0) {
            return None;
        }
        let mut out = Affine::constant(self.constant / k);
        for (n, &c) in &self.terms {
            out.terms.insert(n.clone(), c / k);
        }
        Some(out)
    }

    /// Substitutes names (those not in `env` stay symbolic).
    pub fn substitute(&self, env: &dyn Fn(&str) -> Option<Affine>) -> Option<Affine> {
        let mut out = Affine::constant(self.constant);
        for (n, &c) in &self.terms {
            let v = env(n).unwrap_or_else(|| Affine::name(n));
            out = out.checked_add(&v.checked_scale(c)?)?;
        }
        Some(out)
    }
}

impl fmt::Display for Affine {
    /// `4*D + 1`, `M - N`, `-K`, `0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (n, &c) in &self.terms {
            let (neg, mag) = (c < 0, c.unsigned_abs());
            match (first, neg) {
                (true, true) => f.write_str("-")?,
                (true, false) => {}
                (false, true) => f.write_str(" - ")?,
                (false, false) => f.write_str(" + ")?,
            }
            if mag != 1 {
                write!(f, "{mag}*")?;
            }
            f.write_str(n)?;
            first = false;
        }
        if first {
            return write!(f, "{}", self.constant);
        }
        if self.constant > 0 {
            write!(f, " + {}", self.constant)?;
        } else if self.constant < 0 {
            write!(f, " - {}", self.constant.unsigned_abs())?;
        }
        Ok(())
    }
}

impl fmt::Display for DimExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DimExpr::Int(v) => write!(f, "{v}"),
            DimExpr::Name(n) => f.write_str(n),
            DimExpr::Neg(e) => write!(f, "-({e})"),
            DimExpr::Add(a, b) => write!(f, "({a} + {b})"),
            DimExpr::Sub(a, b) => write!(f, "({a} - {b})"),
            DimExpr::Mul(a, b) => write!(f, "({a} * {b})"),
            DimExpr::FloorDiv(a, b) => write!(f, "({a} // {b})"),
        }
    }
}

/// A parsed node with its affine form (or why it has none).
struct Node {
    expr: DimExpr,
    affine: Result<Affine, DimError>,
}

struct P<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
}

impl<'a> P<'a> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.i).copied()
    }

    fn found(&mut self) -> String {
        match self.peek() {
            None => "the end of the string".to_string(),
            Some(_) => {
                let c = self.text[self.i..].chars().next().unwrap_or('?');
                format!("`{c}`")
            }
        }
    }

    // sum := term (('+' | '-') term)*
    fn sum(&mut self) -> Result<Node, DimError> {
        let mut lhs = self.term()?;
        loop {
            let op = match self.peek() {
                Some(b'+') => b'+',
                Some(b'-') => b'-',
                _ => return Ok(lhs),
            };
            let at = self.i;
            self.i += 1;
            let rhs = self.term()?;
            let affine = match (lhs.affine, rhs.affine) {
                (Ok(a), Ok(b)) => {
                    let r = if op == b'+' {
                        a.checked_add(&b)
                    } else {
                        a.checked_sub(&b)
                    };
                    r.ok_or_else(|| overflow(at))
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            let (a, b) = (Box::new(lhs.expr), Box::new(rhs.expr));
            lhs = Node {
                expr: if op == b'+' {
                    DimExpr::Add(a, b)
                } else {
                    DimExpr::Sub(a, b)
                },
                affine,
            };
        }
    }

    // term := unary (('*' | '//') unary)*
    fn term(&mut self) -> Result<Node, DimError> {
        let mut lhs = self.unary()?;
        loop {
            let div = match self.peek() {
                Some(b'*') => {
                    if self.s.get(self.i + 1) == Some(&b'*') {
                        return err("`**` is not allowed in a dim expression", self.i);
                    }
                    self.i += 1;
                    false
                }
                Some(b'/') => {
                    if self.s.get(self.i + 1) != Some(&b'/') {
                        return err(
                            "use `//` (floor division by a constant); `/` is not allowed in a dim",
                            self.i,
                        );
                    }
                    self.i += 2;
                    true
                }
                _ => return Ok(lhs),
            };
            let op_at = self.i - if div { 2 } else { 1 };
            let rhs = self.unary()?;
            let affine = match (lhs.affine, rhs.affine) {
                (Ok(a), Ok(b)) if div => match b.as_const() {
                    Some(0) => err("division by zero in a dim expression", op_at),
                    Some(k) if k < 0 => err("division by a negative number in a dim expression", op_at),
                    Some(k) => a.exact_div(k).ok_or_else(|| DimError {
                        message: format!("`({a}) // {k}` is not an exact affine expression of the dim names"),
                        offset: op_at,
                    }),
                    None => err(
                        format!("division by `{b}`, which is not a constant: dims must be affine in their names"),
                        op_at,
                    ),
                },
                (Ok(a), Ok(b)) => match (a.as_const(), b.as_const()) {
                    (None, None) => err(
                        format!(
                            "product of `{a}` and `{b}` is not affine: a dim can multiply names by constants, not by other names"
                        ),
                        op_at,
                    ),
                    _ => a.checked_mul(&b).ok_or_else(|| overflow(op_at)),
                },
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            let (a, b) = (Box::new(lhs.expr), Box::new(rhs.expr));
            lhs = Node {
                expr: if div {
                    DimExpr::FloorDiv(a, b)
                } else {
                    DimExpr::Mul(a, b)
                },
                affine,
            };
        }
    }

    // unary := '-' unary | '+' unary | atom
    fn unary(&mut self) -> Result<Node, DimError> {
        match self.peek() {
            Some(b'-') => {
                let at = self.i;
                self.i += 1;
                let inner = self.unary()?;
                let affine = inner
                    .affine
                    .and_then(|a| a.checked_scale(-1).ok_or_else(|| overflow(at)));
                Ok(Node {
                    expr: DimExpr::Neg(Box::new(inner.expr)),
                    affine,
                })
            }
            Some(b'+') => {
                self.i += 1;
                self.unary()
            }
            _ => self.atom(),
        }
    }

    fn atom(&mut self) -> Result<Node, DimError> {
        match self.peek() {
            Some(b'(') => {
                let open = self.i;
                self.i += 1;
                let inner = self.sum()?;
                if self.peek() != Some(b')') {
                    let found = self.found();
                    return err(
                        format!("expected `)` to close the `(` at offset {open}, found {found}"),
                        self.i,
                    );
                }
                self.i += 1;
                Ok(inner)
            }
            Some(c) if c.is_ascii_digit() => {
                let s = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_digit() || self.s[self.i] == b'_')
                {
                    self.i += 1;
                }
                if self.i < self.s.len() && (self.s[self.i].is_ascii_alphabetic()) {
                    return err(
                        "a number directly followed by a name: write `4*D`, not `4D`",
                        self.i,
                    );
                }
                let digits: String = self.text[s..self.i].chars().filter(|&c| c != '_').collect();
                match digits.parse::<i64>() {
                    Ok(v) => Ok(Node {
                        expr: DimExpr::Int(v),
                        affine: Ok(Affine::constant(v)),
                    }),
                    Err(_) => err("integer too large in a dim expression", s),
                }
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let s = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
                {
                    self.i += 1;
                }
                let name = &self.text[s..self.i];
                Ok(Node {
                    expr: DimExpr::Name(name.to_string()),
                    affine: Ok(Affine::name(name)),
                })
            }
            _ => {
                let found = self.found();
                err(
                    format!("expected a dim name, an integer or `(`, found {found}"),
                    self.i,
                )
            }
        }
    }
}

fn overflow(offset: usize) -> DimError {
    DimError {
        message: "dim expression overflows a 64-bit integer".to_string(),
        offset,
    }
}

fn parse_node(s: &str) -> Result<Node, DimError> {
    let mut p = P {
        s: s.as_bytes(),
        text: s,
        i: 0,
    };
    if p.peek().is_none() {
        return err(
            "empty dim expression: write a name such as \"M\" or an integer",
            0,
        );
    }
    let node = p.sum()?;
    if p.peek().is_some() {
        let found = p.found();
        return err(
            format!("unexpected {found} in a dim expression (allowed: names, integers, + - * // and parentheses)"),
            p.i,
        );
    }
    Ok(node)
}

/// Parses a dim string (syntax only; see `parse_affine` for the normal form).
pub fn parse_dim(s: &str) -> Result<DimExpr, DimError> {
    parse_node(s).map(|n| n.expr)
}

/// Parses a dim string and normalises it to an affine form.
pub fn parse_affine(s: &str) -> Result<Affine, DimError> {
    parse_node(s)?.affine
}

/// Normalises a parsed dim expression (error offsets are 0: the tree has no positions;
/// prefer `parse_affine` on the source string).
pub fn to_affine(e: &DimExpr) -> Result<Affine, DimError> {
    parse_affine(&e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> String {
        parse_affine(s)
            .map(|a| a.to_string())
            .unwrap_or_else(|e| format!("error@{}: {}", e.offset, e.message))
    }

    #[test]
    fn affine_forms() {
        assert_eq!(a("M"), "M");
        assert_eq!(a("128"), "128");
        assert_eq!(a("4*D"), "4*D");
        assert_eq!(a("M+1"), "M + 1");
        assert!(a("2*H*D").starts_with("error@3"), "{}", a("2*H*D"));
        assert_eq!(a("H*2*3"), "6*H");
        assert_eq!(a("(M+1)*2"), "2*M + 2");
        assert_eq!(a("M - M + 3"), "3");
        assert_eq!(a(" - K "), "-K");
        assert_eq!(a("N - M"), "-M + N");
        assert_eq!(a("128//2"), "64");
        assert_eq!(a("(2*N+4)//2"), "N + 2");
        assert_eq!(a("1_024"), "1024");
    }

    #[test]
    fn dim_errors() {
        assert!(
            a("M*N").starts_with("error@1: product of `M` and `N`"),
            "{}",
            a("M*N")
        );
        assert!(a("N//2").starts_with("error@1"), "{}", a("N//2"));
        assert!(
            a("N//M").starts_with("error@1: division by `M`"),
            "{}",
            a("N//M")
        );
        assert!(a("N//0").contains("division by zero"));
        assert!(a("").starts_with("error@0: empty"));
        assert!(a("M+").starts_with("error@2"), "{}", a("M+"));
        assert!(a("(M+1").starts_with("error@4"), "{}", a("(M+1"));
        assert!(a("M N").starts_with("error@2"), "{}", a("M N"));
        assert!(a("4D").starts_with("error@1"), "{}", a("4D"));
        assert!(a("M/2").contains("use `//`"));
        assert!(a("M**2").contains("`**`"));
        assert!(a("99999999999999999999").contains("too large"));
        assert!(a("9223372036854775807*2").contains("overflows"));
        assert!(a("M.x").starts_with("error@1"));
    }

    #[test]
    fn trees() {
        assert_eq!(
            parse_dim("-(M+1)*2").unwrap(),
            DimExpr::Mul(
                Box::new(DimExpr::Neg(Box::new(DimExpr::Add(
                    Box::new(DimExpr::Name("M".into())),
                    Box::new(DimExpr::Int(1))
                )))),
                Box::new(DimExpr::Int(2))
            )
        );
        let e = parse_dim("2*H*D").unwrap();
        assert!(matches!(e, DimExpr::Mul(..)));
        assert!(to_affine(&e).is_err());
        assert_eq!(
            to_affine(&parse_dim("4*D-1").unwrap()).unwrap().to_string(),
            "4*D - 1"
        );
        let x = parse_affine("2*M+3").unwrap();
        let env = |n: &str| (n == "M").then(|| Affine::constant(5));
        assert_eq!(x.substitute(&env).unwrap().as_const(), Some(13));
        assert_eq!(parse_affine("K").unwrap().as_name(), Some("K"));
    }
}
