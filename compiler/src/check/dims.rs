//! Symbolic dims: polynomials with integer coefficients over dim names
//! (affine in practice: `r + BM - r` simplifies to `BM`, `"4*D"`, `"M+1"`).
//! Products of names are kept as monomials so that element counts (`M*N`) can
//! be compared for `reshape`.

use std::fmt;
use std::sync::Arc;

type Terms = Vec<(Vec<String>, i64)>;

/// A dim or integer value: `sum(coef * monomial) + constant`, kept normalised
/// (terms sorted, no zero coefficients), so equality is structural.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Dim {
    /// `(monomial, coefficient)`, monomials sorted and non-empty; a monomial
    /// is a sorted list of symbol names. `None` for a constant; shared, so
    /// that cloning a dim (types are cloned a lot) does not allocate.
    terms: Option<Arc<Terms>>,
    constant: i64,
}

const NO_TERMS: &Terms = &Vec::new();

impl Dim {
    pub fn constant(c: i64) -> Dim {
        Dim {
            terms: None,
            constant: c,
        }
    }

    pub fn symbol(name: impl Into<String>) -> Dim {
        Dim {
            terms: Some(Arc::new(vec![(vec![name.into()], 1)])),
            constant: 0,
        }
    }

    fn terms(&self) -> &Terms {
        self.terms.as_deref().unwrap_or(NO_TERMS)
    }

    pub fn as_const(&self) -> Option<i64> {
        self.terms().is_empty().then_some(self.constant)
    }

    /// The single symbol this dim is, if it is exactly one name.
    pub fn as_symbol(&self) -> Option<&str> {
        match (self.terms().as_slice(), self.constant) {
            ([(m, 1)], 0) if m.len() == 1 => Some(&m[0]),
            _ => None,
        }
    }

    pub fn is_one(&self) -> bool {
        self.as_const() == Some(1)
    }

    /// Every symbol the dim mentions, in order, without repeats.
    pub fn symbols(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (m, _) in self.terms() {
            for s in m {
                if !out.contains(&s.as_str()) {
                    out.push(s);
                }
            }
        }
        out
    }

    fn normalise(mut terms: Terms, constant: i64) -> Dim {
        for (m, _) in &mut terms {
            m.sort();
        }
        terms.sort();
        let mut out: Vec<(Vec<String>, i64)> = Vec::with_capacity(terms.len());
        for (m, c) in terms {
            match out.last_mut() {
                Some((lm, lc)) if *lm == m => *lc = lc.wrapping_add(c),
                _ => out.push((m, c)),
            }
        }
        out.retain(|(_, c)| *c != 0);
        Dim {
            terms: (!out.is_empty()).then(|| Arc::new(out)),
            constant,
        }
    }

    pub fn checked_add(&self, other: &Dim) -> Option<Dim> {
        if other.terms.is_none() {
            return Some(Dim {
                terms: self.terms.clone(),
                constant: self.constant.checked_add(other.constant)?,
            });
        }
        if self.terms.is_none() {
            return Some(Dim {
                terms: other.terms.clone(),
                constant: self.constant.checked_add(other.constant)?,
            });
        }
        let mut terms = self.terms().clone();
        terms.extend(other.terms().iter().cloned());
        Some(Dim::normalise(
            terms,
            self.constant.checked_add(other.constant)?,
        ))
    }

    pub fn checked_neg(&self) -> Option<Dim> {
        let mut terms = Vec::with_capacity(self.terms().len());
        for (m, c) in self.terms() {
            terms.push((m.clone(), c.checked_neg()?));
        }
        Some(Dim {
            terms: (!terms.is_empty()).then(|| Arc::new(terms)),
            constant: self.constant.checked_neg()?,
        })
    }

    pub fn checked_sub(&self, other: &Dim) -> Option<Dim> {
        self.checked_add(&other.checked_neg()?)
    }

    pub fn checked_mul(&self, other: &Dim) -> Option<Dim> {
        let mut terms: Terms = Vec::new();
        for (m, c) in self.terms() {
            for (m2, c2) in other.terms() {
                let mut mm = m.clone();
                mm.extend(m2.iter().cloned());
                terms.push((mm, c.checked_mul(*c2)?));
            }
            if other.constant != 0 {
                terms.push((m.clone(), c.checked_mul(other.constant)?));
            }
        }
        if self.constant != 0 {
            for (m2, c2) in other.terms() {
                terms.push((m2.clone(), c2.checked_mul(self.constant)?));
            }
        }
        if terms.len() > 64 {
            return None;
        }
        Some(Dim::normalise(
            terms,
            self.constant.checked_mul(other.constant)?,
        ))
    }

    /// `self / k` when every coefficient is divisible by `k`.
    pub fn exact_div(&self, k: i64) -> Option<Dim> {
        let div = |c: i64| -> Option<i64> {
            (c.checked_rem(k)? == 0).then(|| c.checked_div(k)).flatten()
        };
        let mut terms: Terms = Vec::with_capacity(self.terms().len());
        for (m, c) in self.terms() {
            terms.push((m.clone(), div(*c)?));
        }
        Some(Dim::normalise(terms, div(self.constant)?))
    }

    /// Replaces symbols by dims (`subst` returns `None` to keep a symbol).
    pub fn substitute(&self, subst: &dyn Fn(&str) -> Option<Dim>) -> Option<Dim> {
        let mut acc = Dim::constant(self.constant);
        for (m, c) in self.terms() {
            let mut term = Dim::constant(*c);
            for s in m {
                let v = subst(s).unwrap_or_else(|| Dim::symbol(s.clone()));
                term = term.checked_mul(&v)?;
            }
            acc = acc.checked_add(&term)?;
        }
        Some(acc)
    }

    /// Parses a dim string of a type annotation with the language's dim grammar
    /// (`syntax::dim`: affine in its names, e.g. `"4*D"`, `"M+1"`, `"(2*N)//2"`).
    /// Products of names (`"M*N"`, for flattened shapes) are accepted too: the
    /// checker's dims are polynomials.
    pub fn parse_affine(text: &str) -> Result<Dim, String> {
        let a = match crate::syntax::dim::parse_affine(text) {
            Ok(a) => a,
            Err(e) => return Dim::parse(text).map_err(|_| e.message),
        };
        let mut terms: Terms = a.terms.into_iter().map(|(n, c)| (vec![n], c)).collect();
        terms.retain(|(_, c)| *c != 0);
        Ok(Dim::normalise(terms, a.constant))
    }

    /// Parses a dim string: integers, names, `+ - *` and parentheses (`"4*D"`, `"M+1"`).
    pub fn parse(text: &str) -> Result<Dim, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let d = p.expr()?;
        p.skip_ws();
        if p.i != p.s.len() {
            return Err(format!("unexpected `{}`", &text[p.i..]));
        }
        Ok(d)
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.i).copied()
    }

    fn expr(&mut self) -> Result<Dim, String> {
        let mut acc = self.term()?;
        while let Some(c @ (b'+' | b'-')) = self.peek() {
            self.i += 1;
            let t = self.term()?;
            acc = if c == b'+' {
                acc.checked_add(&t)
            } else {
                acc.checked_sub(&t)
            }
            .ok_or("integer overflow")?;
        }
        Ok(acc)
    }

    fn term(&mut self) -> Result<Dim, String> {
        let mut acc = self.factor()?;
        while self.peek() == Some(b'*') {
            self.i += 1;
            let f = self.factor()?;
            acc = acc.checked_mul(&f).ok_or("integer overflow")?;
        }
        Ok(acc)
    }

    fn factor(&mut self) -> Result<Dim, String> {
        match self.peek() {
            Some(b'-') => {
                self.i += 1;
                self.factor()?
                    .checked_neg()
                    .ok_or_else(|| "integer overflow".to_string())
            }
            Some(b'(') => {
                self.i += 1;
                let d = self.expr()?;
                if self.peek() != Some(b')') {
                    return Err("expected `)`".into());
                }
                self.i += 1;
                Ok(d)
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_digit() || self.s[self.i] == b'_')
                {
                    self.i += 1;
                }
                let digits: String = self.s[start..self.i]
                    .iter()
                    .filter(|c| **c != b'_')
                    .map(|c| *c as char)
                    .collect();
                digits
                    .parse::<i64>()
                    .map(Dim::constant)
                    .map_err(|_| "integer too large".to_string())
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
                {
                    self.i += 1;
                }
                let name = std::str::from_utf8(&self.s[start..self.i]).unwrap_or_default();
                Ok(Dim::symbol(name))
            }
            Some(c) => Err(format!("unexpected `{}`", c as char)),
            None => Err("expected a name or an integer".into()),
        }
    }
}

/// Strips the version suffix the checker gives re-bound runtime names (`i#2` → `i`).
pub fn display_symbol(s: &str) -> &str {
    s.split('#').next().unwrap_or(s)
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let ordered = self
            .terms()
            .iter()
            .filter(|(_, c)| *c > 0)
            .chain(self.terms().iter().filter(|(_, c)| *c < 0));
        for (m, c) in ordered {
            let names: Vec<&str> = m.iter().map(|s| display_symbol(s)).collect();
            let names = names.join("*");
            let (neg, abs) = (*c < 0, c.unsigned_abs());
            if first {
                if neg {
                    f.write_str("-")?;
                }
            } else {
                f.write_str(if neg { " - " } else { " + " })?;
            }
            if abs != 1 {
                write!(f, "{abs}*")?;
            }
            f.write_str(&names)?;
            first = false;
        }
        if first {
            write!(f, "{}", self.constant)
        } else if self.constant > 0 {
            write!(f, " + {}", self.constant)
        } else if self.constant < 0 {
            write!(f, " - {}", self.constant.unsigned_abs())
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_simplification() {
        let r = Dim::symbol("r");
        let bm = Dim::constant(128);
        let end = r.checked_add(&bm).unwrap();
        assert_eq!(end.checked_sub(&r).unwrap(), Dim::constant(128));
        let d = Dim::parse("4*D + 1 - D").unwrap();
        assert_eq!(d.to_string(), "3*D + 1");
        assert_eq!(Dim::parse("M*N").unwrap(), Dim::parse("N * M").unwrap());
        assert_eq!(Dim::parse("-(M - 2)").unwrap().to_string(), "-M + 2");
        assert_eq!(Dim::parse("b - a").unwrap().to_string(), "b - a");
        assert!(Dim::parse("M +").is_err());
        assert!(Dim::parse("M / 2").is_err());
    }

    #[test]
    fn substitution() {
        let d = Dim::parse("2*K + 1").unwrap();
        let s = d
            .substitute(&|s| (s == "K").then(|| Dim::constant(32)))
            .unwrap();
        assert_eq!(s.as_const(), Some(65));
    }
}
