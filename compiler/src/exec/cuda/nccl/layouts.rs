//! How a collective cuts a tensor into its ranks' blocks (and the strided
//! copies between the block-major and the whole layouts), and the checks of
//! the parts' shapes and dtypes.

use super::*;

/// E0707 for arguments the callers check before calling.
pub(super) fn bad_args(message: String) -> ExecError {
    ExecError::new("E0707", message).with_help(
        "this is a compiler bug (a collective's arguments are checked before it runs): please \
         report it",
    )
}

/// A tensor cut along one axis into blocks, in bytes: `outer` rows (the
/// product of the dims before the axis), each the concatenation of every
/// block's `sizes[r] * unit` bytes (`unit`: the bytes of one index along the
/// axis, the dims after it times the element's bytes).
///
/// The block-major layout puts each block's `outer` rows together, blocks
/// in order: block `r` is then contiguous, and is the tensor that block is.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Split {
    pub(super) outer: usize,
    pub(super) unit: usize,
    pub(super) sizes: Vec<usize>,
}

/// A strided copy of `height` rows of `width` bytes, between the
/// block-major layout (at `block`, rows `block_pitch` apart) and the whole
/// tensor's (at `whole`, rows `whole_pitch` apart).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Strided {
    pub(super) block: usize,
    pub(super) block_pitch: usize,
    pub(super) whole: usize,
    pub(super) whole_pitch: usize,
    pub(super) width: usize,
    pub(super) height: usize,
}

impl Split {
    /// `shape` (the whole tensor's) cut along `axis` into `sizes`, elements
    /// of `elem` bytes.
    pub(super) fn new(shape: &[usize], axis: usize, sizes: Vec<usize>, elem: usize) -> Split {
        Split {
            outer: shape[..axis].iter().product(),
            unit: shape[axis + 1..].iter().product::<usize>() * elem,
            sizes,
        }
    }

    pub(super) fn total(&self) -> usize {
        self.sizes.iter().sum()
    }

    pub(super) fn prefix(&self, r: usize) -> usize {
        self.sizes[..r].iter().sum()
    }

    /// Every block the same size: NCCL's all-gather and reduce-scatter fit.
    pub(super) fn equal(&self) -> bool {
        self.sizes.windows(2).all(|w| w[0] == w[1])
    }

    /// The blocks are contiguous in the whole tensor (no staging).
    pub(super) fn contiguous(&self) -> bool {
        self.outer <= 1
    }

    /// Block `r`'s offset in the block-major layout.
    pub(super) fn block_offset(&self, r: usize) -> usize {
        self.outer * self.prefix(r) * self.unit
    }

    pub(super) fn block_bytes(&self, r: usize) -> usize {
        self.outer * self.sizes[r] * self.unit
    }

    /// The copies between the block-major layout and the whole tensor's,
    /// one per block.
    pub(super) fn copies(&self) -> Vec<Strided> {
        let whole_pitch = self.total() * self.unit;
        (0..self.sizes.len())
            .map(|r| Strided {
                block: self.block_offset(r),
                block_pitch: self.sizes[r] * self.unit,
                whole: self.prefix(r) * self.unit,
                whole_pitch,
                width: self.sizes[r] * self.unit,
                height: self.outer,
            })
            .collect()
    }
}

/// The parts' common dtype (E0707 when they differ, or there are none).
pub(super) fn common_dtype(name: &str, parts: &[(Arc<Gpu>, Tensor)]) -> Result<DType, ExecError> {
    let Some((_, first)) = parts.first() else {
        return Err(bad_args(format!("{name} over no GPU")));
    };
    let dtype = first.dtype();
    if let Some((_, t)) = parts.iter().find(|(_, t)| t.dtype() != dtype) {
        return Err(bad_args(format!(
            "{name} of {dtype} and {} tensors",
            t.dtype()
        )));
    }
    Ok(dtype)
}

/// E0707 unless every shape is `shape`.
pub(super) fn same_shapes(name: &str, shapes: &[&[usize]]) -> Result<(), ExecError> {
    if let Some(s) = shapes.iter().find(|s| **s != shapes[0]) {
        return Err(bad_args(format!(
            "{name} of tensors of shapes {:?} and {s:?}",
            shapes[0]
        )));
    }
    Ok(())
}

/// The whole shape of shards `shapes` along `axis`, and their split.
pub(super) fn gather_split(
    name: &str,
    shapes: &[&[usize]],
    axis: usize,
    elem: usize,
) -> Result<(Vec<usize>, Split), ExecError> {
    let first = shapes[0];
    if axis >= first.len() {
        return Err(bad_args(format!(
            "{name} along axis {axis} of a rank-{} tensor",
            first.len()
        )));
    }
    for s in shapes {
        let fits = s.len() == first.len()
            && s.iter()
                .zip(first)
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !fits {
            return Err(bad_args(format!(
                "{name} along axis {axis} of shards of shapes {first:?} and {s:?}"
            )));
        }
    }
    let sizes: Vec<usize> = shapes.iter().map(|s| s[axis]).collect();
    let mut whole = first.to_vec();
    whole[axis] = sizes.iter().sum();
    let split = Split::new(&whole, axis, sizes, elem);
    Ok((whole, split))
}

/// The split of `shape` along `axis` into `sizes` (one per rank, summing to
/// the axis's size).
pub(super) fn scatter_split(
    name: &str,
    shape: &[usize],
    ranks: usize,
    axis: usize,
    sizes: &[usize],
    elem: usize,
) -> Result<Split, ExecError> {
    if axis >= shape.len() {
        return Err(bad_args(format!(
            "{name} along axis {axis} of a rank-{} tensor",
            shape.len()
        )));
    }
    if sizes.len() != ranks || sizes.iter().sum::<usize>() != shape[axis] {
        return Err(bad_args(format!(
            "{name} of a tensor of shape {shape:?} into blocks {sizes:?} along axis {axis} \
             over {ranks} GPUs"
        )));
    }
    Ok(Split::new(shape, axis, sizes.to_vec(), elem))
}
