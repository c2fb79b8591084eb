//! Tensors spread over several devices of one session, and the collectives
//! between their parts (docs/multi-gpu.md has the user's view).
//!
//! A [`DistTensor`] is one logical tensor (its shape is what the checker sees)
//! held as one part per device, with a [`Placement`] that says how the parts
//! make the logical value:
//!
//! * `Sharded { axis }`: the parts are consecutive pieces along `axis`, sized as
//!   `numpy.array_split` sizes them ([`split_sizes`]); the value is their
//!   concatenation.
//! * `Replicated`: every part is the whole value.
//! * `Partial(op)`: every part has the whole shape and the value is their
//!   elementwise `op` (what a reduction over a sharded axis, or a matmul whose
//!   contraction axis is sharded, leaves on each device).
//!
//! Collectives act on the parts as NCCL acts on per-device buffers: `all_reduce`
//! makes every part the elementwise reduction of all parts (so a sharded
//! tensor's shards, which must then be of equal size, all become the same
//! block), `all_gather` gives every device the whole of a sharded tensor,
//! `reduce_scatter` gives device `i` block `i` of the reduction, `broadcast`
//! copies one part to all. The logical shape never changes, so the checker's
//! static shapes hold whatever the device count.
//!
//! The host implementations here serve the CPU's virtual devices and are the
//! reference the GPU's (NCCL) collectives are tested against. `infer` decides
//! how a whole-tensor function runs on distributed arguments.

pub mod group;
pub mod infer;

pub use group::{Done, Group, Member};

use std::sync::Arc;

use super::cuda::{nccl, Gpu};
use super::{ExecError, Interrupt, Tensor};
use crate::check::DType;

/// Where a distributed tensor's parts are: in the host's memory (the CPU's
/// virtual devices), or each on a GPU (in part order), where the collectives
/// go through NCCL.
#[derive(Clone, Copy)]
pub enum Site<'a> {
    Host,
    Gpus(&'a [Arc<Gpu>]),
}

impl Site<'_> {
    /// `d`'s parts with their GPUs, for NCCL; `None` on the host.
    fn gpu_parts(&self, d: &DistTensor) -> Option<Vec<(Arc<Gpu>, Tensor)>> {
        match self {
            Site::Host => None,
            Site::Gpus(gpus) => Some(
                gpus.iter()
                    .cloned()
                    .zip(d.parts.iter().map(|p| p.tensor.clone()))
                    .collect(),
            ),
        }
    }
}

/// How a collective (or a partial value) combines parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    Mean,
}

impl ReduceOp {
    pub const NAMES: [&'static str; 4] = crate::check::builtins::REDUCE_OPS;

    pub fn parse(s: &str) -> Option<ReduceOp> {
        Some(match s {
            "sum" => ReduceOp::Sum,
            "max" => ReduceOp::Max,
            "min" => ReduceOp::Min,
            "mean" => ReduceOp::Mean,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Mean => "mean",
        }
    }

    /// The combination of `xs` (in device order), in f64.
    fn float(self, xs: &[f64]) -> f64 {
        match self {
            ReduceOp::Sum => xs.iter().sum(),
            ReduceOp::Mean => xs.iter().sum::<f64>() / xs.len() as f64,
            ReduceOp::Max => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Min => xs.iter().copied().fold(f64::INFINITY, f64::min),
        }
    }

    /// The combination of integers: sums wrap as the dtype's arithmetic
    /// does (the caller wraps); the mean truncates toward zero as NCCL's
    /// integer average does.
    fn int(self, xs: &[i64]) -> i64 {
        match self {
            ReduceOp::Sum => xs.iter().fold(0i64, |a, &b| a.wrapping_add(b)),
            ReduceOp::Mean => {
                let s: i128 = xs.iter().map(|&x| x as i128).sum();
                (s / xs.len() as i128) as i64
            }
            ReduceOp::Max => xs.iter().copied().max().unwrap_or(0),
            ReduceOp::Min => xs.iter().copied().min().unwrap_or(0),
        }
    }
}

/// How the parts of a [`DistTensor`] make its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    Replicated,
    Sharded { axis: usize },
    Partial(ReduceOp),
}

/// One device's part: `device` indexes the session's device list.
#[derive(Clone, Debug)]
pub struct Part {
    pub device: usize,
    pub tensor: Tensor,
}

/// A logical tensor held as parts on several devices.
#[derive(Clone, Debug)]
pub struct DistTensor {
    shape: Vec<usize>,
    dtype: DType,
    placement: Placement,
    parts: Vec<Part>,
}

/// The code of errors in how a tensor is distributed or collected.
pub const E_DIST: &str = "E0737";

/// The sizes of `n` shards of an axis of length `len`, as
/// `numpy.array_split` makes them: the first `len % n` one longer.
/// E0737 when there are fewer elements than devices (a shard would be empty).
pub fn split_sizes(len: usize, n: usize) -> Result<Vec<usize>, ExecError> {
    if n == 0 || len < n {
        return Err(ExecError::new(
            E_DIST,
            format!("an axis of {len} elements cannot be split over {n} devices"),
        )
        .with_help("every device needs at least one element: shard a longer axis, or pass fewer `devices=`"));
    }
    Ok((0..n).map(|i| len / n + usize::from(i < len % n)).collect())
}

impl DistTensor {
    /// A distributed tensor from its parts; the caller guarantees the parts
    /// agree with the placement (the functions of this module do).
    pub fn from_parts(
        shape: Vec<usize>,
        dtype: DType,
        placement: Placement,
        parts: Vec<Part>,
    ) -> DistTensor {
        debug_assert!(!parts.is_empty());
        DistTensor {
            shape,
            dtype,
            placement,
            parts,
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn placement(&self) -> Placement {
        self.placement
    }

    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The session devices holding the parts, in order.
    pub fn devices(&self) -> Vec<usize> {
        self.parts.iter().map(|p| p.device).collect()
    }

    /// The part sizes along the sharded axis (`None` unless sharded).
    pub fn shard_sizes(&self) -> Option<Vec<usize>> {
        match self.placement {
            Placement::Sharded { axis } => {
                Some(self.parts.iter().map(|p| p.tensor.shape()[axis]).collect())
            }
            _ => None,
        }
    }

    /// How it is held, for messages: `sharded on axis 0 over 4 devices (3, 3, 2, 2 rows)`.
    pub fn describe_placement(&self, device_name: &dyn Fn(usize) -> String) -> String {
        let devices: Vec<String> = self.parts.iter().map(|p| device_name(p.device)).collect();
        let on = devices.join(", ");
        match self.placement {
            Placement::Sharded { axis } => {
                let sizes: Vec<String> = self
                    .shard_sizes()
                    .unwrap_or_default()
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                format!(
                    "sharded on axis {axis} over {on} (sizes {})",
                    sizes.join(", ")
                )
            }
            Placement::Replicated => format!("replicated on {on}"),
            Placement::Partial(op) => {
                format!(
                    "partial ({}) over {on}: the value is the {} of the parts",
                    op.name(),
                    op.name()
                )
            }
        }
    }

    /// A tensor of `shape` on the same devices with `tensors` as its parts.
    fn with_parts(
        &self,
        tensors: Vec<Tensor>,
        shape: Vec<usize>,
        placement: Placement,
    ) -> DistTensor {
        let parts = self
            .parts
            .iter()
            .zip(tensors)
            .map(|(p, tensor)| Part {
                device: p.device,
                tensor,
            })
            .collect();
        DistTensor::from_parts(shape, self.dtype, placement, parts)
    }

    /// The whole value as one tensor on the host: the shards concatenated,
    /// a replica, or the parts combined.
    pub fn gather(&self, interrupt: &Interrupt) -> Result<Tensor, ExecError> {
        let parts: Vec<&Tensor> = self.parts.iter().map(|p| &p.tensor).collect();
        match self.placement {
            Placement::Sharded { axis } => Tensor::concat(&parts, axis, interrupt),
            Placement::Replicated => parts[0].try_deep_clone(interrupt),
            Placement::Partial(op) => combine(&parts, op, interrupt),
        }
    }
}

fn combine(parts: &[&Tensor], op: ReduceOp, interrupt: &Interrupt) -> Result<Tensor, ExecError> {
    Tensor::combine(parts, |xs| op.float(xs), |xs| op.int(xs), interrupt)
}

/// `axis` of a tensor of rank `rank` (negative counts from the end); E0737
/// when out of range.
pub fn normalize_axis(axis: i64, rank: usize, what: &str) -> Result<usize, ExecError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if rank == 0 || !(0..r).contains(&a) {
        return Err(ExecError::new(
            E_DIST,
            format!("{what}: axis {axis} is out of range for a tensor of rank {rank}"),
        )
        .with_help(if rank == 0 {
            "a scalar tensor has no axis to split".to_string()
        } else {
            format!("the axes are 0 to {} (or -1 to -{rank})", rank - 1)
        }));
    }
    Ok(a as usize)
}

/// `t` split along `axis` over `devices` (host copies; the caller moves each
/// to its device).
pub fn shard(
    t: &Tensor,
    axis: usize,
    devices: &[usize],
    interrupt: &Interrupt,
) -> Result<DistTensor, ExecError> {
    let sizes = split_sizes(t.shape()[axis], devices.len())?;
    let mut parts = Vec::with_capacity(devices.len());
    let mut start = 0;
    for (&device, &len) in devices.iter().zip(&sizes) {
        parts.push(Part {
            device,
            tensor: t.narrow(axis, start, len, interrupt)?,
        });
        start += len;
    }
    Ok(DistTensor::from_parts(
        t.shape().to_vec(),
        t.dtype(),
        Placement::Sharded { axis },
        parts,
    ))
}

/// `t` copied whole to each of `devices`.
pub fn replicate(
    t: &Tensor,
    devices: &[usize],
    interrupt: &Interrupt,
) -> Result<DistTensor, ExecError> {
    let parts = devices
        .iter()
        .map(|&device| {
            Ok(Part {
                device,
                tensor: t.try_deep_clone(interrupt)?,
            })
        })
        .collect::<Result<_, ExecError>>()?;
    Ok(DistTensor::from_parts(
        t.shape().to_vec(),
        t.dtype(),
        Placement::Replicated,
        parts,
    ))
}

/// The parts' shapes must all be equal for an elementwise collective; E0737
/// naming `what` otherwise.
fn equal_parts(d: &DistTensor, what: &str) -> Result<(), ExecError> {
    let first = d.parts[0].tensor.shape();
    if d.parts.iter().all(|p| p.tensor.shape() == first) {
        return Ok(());
    }
    let sizes = d.shard_sizes().unwrap_or_default();
    Err(ExecError::new(
        E_DIST,
        format!(
            "{what} combines the devices' parts elementwise, but the shards have different sizes ({})",
            sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
        ),
    )
    .with_help("shard an axis whose length the device count divides, or `all_gather` the tensor first"))
}

/// Every part becomes the elementwise `op` of all parts (NCCL's all-reduce).
/// A partial or replicated input gives a replicated result; a sharded one
/// (equal shards) stays sharded, each shard now the same block.
pub fn all_reduce(
    d: &DistTensor,
    op: ReduceOp,
    site: Site,
    interrupt: &Interrupt,
) -> Result<DistTensor, ExecError> {
    equal_parts(d, "all_reduce")?;
    let placement = match d.placement {
        Placement::Sharded { axis } => Placement::Sharded { axis },
        _ => Placement::Replicated,
    };
    if let Some(parts) = site.gpu_parts(d) {
        let out = nccl::all_reduce(&parts, op)?;
        return Ok(d.with_parts(out, d.shape.clone(), placement));
    }
    let parts: Vec<&Tensor> = d.parts.iter().map(|p| &p.tensor).collect();
    let reduced = combine(&parts, op, interrupt)?;
    copies(d, &reduced, placement, interrupt)
}

/// Every device gets the whole of a sharded tensor.
pub fn all_gather(
    d: &DistTensor,
    site: Site,
    interrupt: &Interrupt,
) -> Result<DistTensor, ExecError> {
    let Placement::Sharded { axis } = d.placement else {
        return Err(ExecError::new(
            E_DIST,
            "all_gather takes a sharded tensor: this one is already whole on every device"
                .to_string(),
        )
        .with_help("for a partial value, `all_reduce` makes it whole on every device"));
    };
    if let Some(parts) = site.gpu_parts(d) {
        let out = nccl::all_gather(&parts, axis)?;
        return Ok(d.with_parts(out, d.shape.clone(), Placement::Replicated));
    }
    let whole = d.gather(interrupt)?;
    copies(d, &whole, Placement::Replicated, interrupt)
}

/// Device `i` gets block `i` along `axis` of the elementwise `op` of the
/// parts (which must have the logical shape: a partial or replicated tensor).
pub fn reduce_scatter(
    d: &DistTensor,
    op: ReduceOp,
    axis: usize,
    site: Site,
    interrupt: &Interrupt,
) -> Result<DistTensor, ExecError> {
    if let Placement::Sharded { .. } = d.placement {
        return Err(ExecError::new(
            E_DIST,
            "reduce_scatter takes a tensor that every device holds whole (partial or replicated); this one is sharded",
        )
        .with_help("`all_reduce` combines equal shards; `all_gather` first to reduce-scatter the whole"));
    }
    if let Some(parts) = site.gpu_parts(d) {
        let sizes = split_sizes(d.shape[axis], d.parts.len())?;
        let out = nccl::reduce_scatter(&parts, op, axis, &sizes)?;
        return Ok(d.with_parts(out, d.shape.clone(), Placement::Sharded { axis }));
    }
    let parts: Vec<&Tensor> = d.parts.iter().map(|p| &p.tensor).collect();
    let reduced = combine(&parts, op, interrupt)?;
    let devices = d.devices();
    shard(&reduced, axis, &devices, interrupt)
}

/// Every part becomes a copy of part `src` (an index into the parts).
pub fn broadcast(
    d: &DistTensor,
    src: usize,
    site: Site,
    interrupt: &Interrupt,
) -> Result<DistTensor, ExecError> {
    if src >= d.parts.len() {
        return Err(ExecError::new(
            E_DIST,
            format!(
                "broadcast from part {src}, but the tensor has {} parts",
                d.parts.len()
            ),
        )
        .with_help(format!(
            "`src` is the index of a part: 0 to {}",
            d.parts.len() - 1
        )));
    }
    equal_parts(d, "broadcast")?;
    let placement = match d.placement {
        Placement::Sharded { axis } => Placement::Sharded { axis },
        _ => Placement::Replicated,
    };
    if let Some(parts) = site.gpu_parts(d) {
        return Ok(d.with_parts(nccl::broadcast(&parts, src)?, d.shape.clone(), placement));
    }
    let from = d.parts[src].tensor.clone();
    copies(d, &from, placement, interrupt)
}

/// One copy of `t` per part of `d`, on the same devices.
fn copies(
    d: &DistTensor,
    t: &Tensor,
    placement: Placement,
    interrupt: &Interrupt,
) -> Result<DistTensor, ExecError> {
    let parts = d
        .parts
        .iter()
        .map(|p| {
            Ok(Part {
                device: p.device,
                tensor: t.try_deep_clone(interrupt)?,
            })
        })
        .collect::<Result<_, ExecError>>()?;
    Ok(DistTensor::from_parts(
        d.shape.clone(),
        d.dtype,
        placement,
        parts,
    ))
}

#[cfg(test)]
mod tests;
