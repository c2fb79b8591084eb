//! How a tensor prints: NumPy-like, summarised past a size, rounded to
//! the dtype's precision.

use super::*;

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Elements shown per axis edge once a tensor has more than `SUMMARY_AT` elements.
const EDGE_ITEMS: usize = 3;
const SUMMARY_AT: usize = 1000;

impl fmt::Display for Tensor {
    /// numpy-like: `tensor([[1.0000, 2.0000],\n        [3.0000, 4.0000]], f32)`;
    /// floats with 4 decimals, f64 with 8 (as numpy prints float64: an f64
    /// result is usually asked for its extra digits), scientific when
    /// magnitudes need it; columns aligned, more than 1000 elements summarised
    /// with `...` (3 items per edge); the shape shown when summarised or when
    /// the tensor has no elements (`tensor([], f32, shape=[0, 3])`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only the shown elements are read: a multi-GB tensor is not copied.
        let store = self.storage.data();
        let at = |o: usize| store.get(self.dtype, o);
        let numel = self.numel();
        let summarise = numel > SUMMARY_AT;
        // The elements shown, to size the columns.
        let shown = shown_offsets(&self.shape, summarise);
        let sci = self.dtype.is_float() && {
            let finite: Vec<f64> = shown
                .iter()
                .map(|&o| at(o).abs())
                .filter(|x| x.is_finite() && *x != 0.0)
                .collect();
            let max = finite.iter().cloned().fold(0.0, f64::max);
            let min = finite.iter().cloned().fold(f64::INFINITY, f64::min);
            max >= 1e8 || (min < 1e-4 && min.is_finite())
        };
        let digits = if self.dtype == DType::F64 { 8 } else { 4 };
        let fmt_one = |x: f64| -> String {
            if self.dtype == DType::Bool {
                if x != 0.0 { "True" } else { "False" }.to_string()
            } else if !self.dtype.is_float() {
                format!("{}", x as i64)
            } else if x.is_nan() {
                "nan".to_string()
            } else if x.is_infinite() {
                if x > 0.0 { "inf" } else { "-inf" }.to_string()
            } else if sci {
                format!("{x:.digits$e}")
            } else {
                format!("{x:.digits$}")
            }
        };
        // Integers are shown from their integer value (an i64 above 2^53 is
        // not exact in f64).
        let show = |o: usize| -> String {
            if self.dtype.is_int() {
                store.get_int(self.dtype, o).to_string()
            } else {
                fmt_one(at(o))
            }
        };
        let width = shown.iter().map(|&o| show(o).len()).max().unwrap_or(0);
        let mut out = String::from("tensor(");
        if self.shape.is_empty() {
            out.push_str(&show(0));
        } else {
            let st = strides(&self.shape);
            render(&mut out, &self.shape, &st, 0, 0, &show, summarise, width, 7);
        }
        out.push_str(", ");
        out.push_str(self.dtype.name());
        if summarise || numel == 0 {
            let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
            out.push_str(&format!(", shape=[{}]", dims.join(", ")));
        }
        out.push(')');
        f.write_str(&out)
    }
}

/// The positions of axis of size `n` that are printed.
fn shown_positions(n: usize, summarise: bool) -> Vec<Option<usize>> {
    if summarise && n > 2 * EDGE_ITEMS {
        let mut v: Vec<Option<usize>> = (0..EDGE_ITEMS).map(Some).collect();
        v.push(None);
        v.extend((n - EDGE_ITEMS..n).map(Some));
        v
    } else {
        (0..n).map(Some).collect()
    }
}

fn shown_offsets(shape: &[usize], summarise: bool) -> Vec<usize> {
    let st = strides(shape);
    let mut offs = vec![0usize];
    for (a, &n) in shape.iter().enumerate() {
        let pos: Vec<usize> = shown_positions(n, summarise)
            .into_iter()
            .flatten()
            .collect();
        let s = st[a];
        offs = offs
            .iter()
            .flat_map(|o| pos.iter().map(move |p| o + p * s))
            .collect();
    }
    offs
}

#[allow(clippy::too_many_arguments)]
fn render(
    out: &mut String,
    shape: &[usize],
    st: &[usize],
    axis: usize,
    base: usize,
    show: &dyn Fn(usize) -> String,
    summarise: bool,
    width: usize,
    indent: usize,
) {
    out.push('[');
    let pos = shown_positions(shape[axis], summarise);
    let last = axis + 1 == shape.len();
    for (i, p) in pos.iter().enumerate() {
        if i > 0 {
            if last {
                out.push_str(", ");
            } else {
                out.push(',');
                for _ in 0..(shape.len() - axis - 1) {
                    out.push('\n');
                }
                out.push_str(&" ".repeat(indent + axis + 1));
            }
        }
        match p {
            None => out.push_str("..."),
            Some(p) if last => {
                out.push_str(&format!("{:>width$}", show(base + p * st[axis])));
            }
            Some(p) => render(
                out,
                shape,
                st,
                axis + 1,
                base + p * st[axis],
                show,
                summarise,
                width,
                indent,
            ),
        }
    }
    out.push(']');
}
