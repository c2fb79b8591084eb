//! The devices running one whole-tensor function together: each runs the
//! function's schedule on its own parts (a thread per device), and meets the
//! others at every collective step, as the ranks of an NCCL communicator do.
//!
//! [`Group::collective`] is a rendezvous: each member leaves its part, the
//! last to arrive computes every member's result, and each takes its own.
//! A round is drained (every member has taken its result) before the next
//! one collects, so the collectives of a loop cannot mix. A member that fails
//! before a collective [`Group::abort`]s the group so that the others stop
//! waiting; Ctrl-C (the interrupt) does the same.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::{combine, split_sizes, ReduceOp, E_DIST};
use crate::exec::cuda::{nccl, Gpu};
use crate::exec::{Device, ExecError, Interrupt, Tensor};
use crate::ir::graph::{Collective, ReduceKind};

/// One device's place in a group.
#[derive(Clone)]
pub struct Member {
    pub group: Arc<Group>,
    pub rank: usize,
}

#[derive(Default)]
struct Round {
    parts: Vec<Option<Tensor>>,
    /// Where each member wants its result (`None`: a new tensor).
    into: Vec<Option<Tensor>>,
    /// Each member's GPU (`None`: the host).
    gpus: Vec<Option<Arc<Gpu>>>,
    arrived: usize,
    /// Each member's result, taken by that member.
    results: Option<Result<Vec<Option<Done>>, ExecError>>,
    taken: usize,
    aborted: Option<ExecError>,
}

/// A member's result of a collective.
pub enum Done {
    /// Computed (on the host, or joined on the member's GPU).
    Ready(Tensor),
    /// Still running on the GPUs (NCCL), written into the member's given
    /// tensor: joining it orders the member's GPU after it, so the
    /// member's kernels that do not read it run meanwhile.
    Running(nccl::RankPending),
}

/// The devices of one distributed function call.
pub struct Group {
    n: usize,
    round: Mutex<Round>,
    cv: Condvar,
}

impl Group {
    /// How many devices run together.
    pub fn size(&self) -> usize {
        self.n
    }

    pub fn new(n: usize) -> Arc<Group> {
        Arc::new(Group {
            n,
            round: Mutex::new(Round {
                parts: vec![None; n],
                into: vec![None; n],
                gpus: vec![None; n],
                ..Round::default()
            }),
            cv: Condvar::new(),
        })
    }

    /// The members, rank 0 first.
    pub fn members(self: &Arc<Group>) -> Vec<Member> {
        (0..self.n)
            .map(|rank| Member {
                group: self.clone(),
                rank,
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Round> {
        self.round.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A member failed (or was interrupted): the others stop waiting with
    /// an error that says so.
    pub fn abort(&self, why: &ExecError) {
        let mut r = self.lock();
        if r.aborted.is_none() {
            r.aborted = Some(
                ExecError::new(
                    E_DIST,
                    format!(
                        "another device stopped before this collective: {}",
                        why.message
                    ),
                )
                .with_help("the error of the device that stopped is the one to fix"),
            );
        }
        self.cv.notify_all();
    }

    /// Waits on the condition variable, polling the interrupt.
    fn wait<'a>(
        &self,
        guard: std::sync::MutexGuard<'a, Round>,
        interrupt: &Interrupt,
    ) -> Result<std::sync::MutexGuard<'a, Round>, ExecError> {
        let (mut g, _) = self
            .cv
            .wait_timeout(guard, Duration::from_millis(50))
            .unwrap_or_else(|p| p.into_inner());
        if interrupt.is_set() {
            let e = ExecError::interrupted();
            if g.aborted.is_none() {
                g.aborted = Some(e.clone());
            }
            self.cv.notify_all();
            return Err(e);
        }
        if let Some(e) = &g.aborted {
            return Err(e.clone());
        }
        Ok(g)
    }

    /// Member `rank`'s result of `op` over every member's `part`, which is
    /// on `device`: through NCCL when every member's is a GPU.
    pub fn collective(
        &self,
        rank: usize,
        op: Collective,
        part: &Tensor,
        device: &Device,
        interrupt: &Interrupt,
    ) -> Result<Tensor, ExecError> {
        match self.collective_into(rank, op, part, None, device, interrupt)? {
            Done::Ready(t) => Ok(t),
            Done::Running(p) => p.join(),
        }
    }

    /// As [`Group::collective`], with the result written into `into` (of
    /// the result's shape and dtype) where every member gives one and the
    /// collective runs on GPUs: then it is returned still running.
    pub fn collective_into(
        &self,
        rank: usize,
        op: Collective,
        part: &Tensor,
        into: Option<&Tensor>,
        device: &Device,
        interrupt: &Interrupt,
    ) -> Result<Done, ExecError> {
        let mut r = self.lock();
        // The previous round is still being taken.
        while r.results.is_some() {
            r = self.wait(r, interrupt)?;
        }
        if let Some(e) = &r.aborted {
            return Err(e.clone());
        }
        r.parts[rank] = Some(part.clone());
        r.into[rank] = into.cloned();
        r.gpus[rank] = match device {
            Device::Cuda(g) => Some(g.clone()),
            Device::Cpu => None,
        };
        r.arrived += 1;
        if r.arrived == self.n {
            let parts: Vec<Tensor> = r
                .parts
                .iter_mut()
                .map(|p| p.take().expect("every part arrived"))
                .collect();
            let gpus: Option<Vec<Arc<Gpu>>> = r.gpus.iter().cloned().collect();
            let into: Option<Vec<Tensor>> = r.into.iter_mut().map(Option::take).collect();
            let ready = |all: Vec<Tensor>| all.into_iter().map(|t| Some(Done::Ready(t))).collect();
            r.results = Some(match gpus {
                Some(gpus) => on_gpus(op, gpus, parts, into.as_deref()).map(|o| match o {
                    OnGpus::Joined(all) => ready(all),
                    OnGpus::Running(p) => p
                        .into_ranks()
                        .into_iter()
                        .map(|p| Some(Done::Running(p)))
                        .collect(),
                }),
                None => compute(op, &parts, interrupt).map(ready),
            });
            r.arrived = 0;
            self.cv.notify_all();
        }
        while r.results.is_none() {
            r = self.wait(r, interrupt)?;
        }
        let mine = match r.results.as_mut().expect("results are set") {
            Ok(all) => Ok(all[rank].take().expect("each member takes its own once")),
            Err(e) => Err(e.clone()),
        };
        r.taken += 1;
        if r.taken == self.n {
            r.results = None;
            r.taken = 0;
            self.cv.notify_all();
        }
        mine
    }
}

/// Every member's result, on the host (their devices' copies are made at
/// their next use).
fn compute(
    op: Collective,
    parts: &[Tensor],
    interrupt: &Interrupt,
) -> Result<Vec<Tensor>, ExecError> {
    // A gather concatenates shards of any sizes; the others combine or copy
    // parts of one shape.
    if let Collective::AllGather { axis } = op {
        let refs: Vec<&Tensor> = parts.iter().collect();
        let whole = Tensor::concat(&refs, axis.unwrap_or(0), interrupt)?;
        return copies(whole, parts.len(), interrupt);
    }
    let first = parts[0].shape();
    if parts.iter().any(|p| p.shape() != first) {
        let shapes: Vec<String> = parts.iter().map(|p| format!("{:?}", p.shape())).collect();
        return Err(ExecError::new(
            E_DIST,
            format!(
                "a collective combines the devices' parts elementwise, but they have different shapes ({})",
                shapes.join(", ")
            ),
        )
        .with_help("shard an axis whose length the device count divides"));
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    match op {
        Collective::AllReduce(kind) => copies(
            combine(&refs, reduce_op(kind), interrupt)?,
            parts.len(),
            interrupt,
        ),
        Collective::Broadcast { src } => {
            let Some(p) = parts.get(src) else {
                return Err(ExecError::new(
                    E_DIST,
                    format!(
                        "broadcast from part {src}, but the tensor has {} parts",
                        parts.len()
                    ),
                )
                .with_help(format!(
                    "`src` is the index of a part: 0 to {}",
                    parts.len() - 1
                )));
            };
            copies(p.try_deep_clone(interrupt)?, parts.len(), interrupt)
        }
        Collective::ReduceScatter { op, axis } => {
            let reduced = combine(&refs, reduce_op(op), interrupt)?;
            let sizes = split_sizes(reduced.shape()[axis], parts.len())?;
            let mut start = 0;
            let mut out = Vec::with_capacity(parts.len());
            for len in sizes {
                out.push(reduced.narrow(axis, start, len, interrupt)?);
                start += len;
            }
            Ok(out)
        }
        Collective::Shard { .. } | Collective::AllGather { .. } => {
            unreachable!("a shard needs no other device; a gather is above")
        }
    }
}

/// `n` copies of `one`.
fn copies(one: Tensor, n: usize, interrupt: &Interrupt) -> Result<Vec<Tensor>, ExecError> {
    let mut out = Vec::with_capacity(n);
    for _ in 1..n {
        out.push(one.try_deep_clone(interrupt)?);
    }
    out.push(one);
    Ok(out)
}

/// A collective's results on the GPUs.
enum OnGpus {
    Joined(Vec<Tensor>),
    Running(nccl::Pending),
}

/// Every member's result through NCCL (the parts on their GPUs), written
/// into `into` when given.
fn on_gpus(
    op: Collective,
    gpus: Vec<Arc<Gpu>>,
    parts: Vec<Tensor>,
    into: Option<&[Tensor]>,
) -> Result<OnGpus, ExecError> {
    let first = parts[0].shape().to_vec();
    let same = parts.iter().all(|p| p.shape() == first.as_slice());
    let n = parts.len();
    let host = |parts: Vec<(Arc<Gpu>, Tensor)>| {
        let tensors: Vec<Tensor> = parts.into_iter().map(|(_, t)| t).collect();
        compute(op, &tensors, &Interrupt::new()).map(OnGpus::Joined)
    };
    let parts: Vec<(Arc<Gpu>, Tensor)> = gpus.into_iter().zip(parts).collect();
    let pending = match op {
        Collective::AllGather { axis } => nccl::all_gather_async(&parts, axis.unwrap_or(0), into),
        // The host's error for parts of different shapes.
        _ if !same => return host(parts),
        Collective::AllReduce(kind) => nccl::all_reduce_async(&parts, reduce_op(kind), into),
        Collective::Broadcast { src } if src < n => nccl::broadcast_async(&parts, src, into),
        Collective::ReduceScatter { op, axis } => {
            let sizes = split_sizes(first[axis], n)?;
            nccl::reduce_scatter_async(&parts, reduce_op(op), axis, &sizes, into)
        }
        Collective::Broadcast { .. } | Collective::Shard { .. } => return host(parts),
    }?;
    Ok(match into {
        Some(_) => OnGpus::Running(pending),
        None => OnGpus::Joined(pending.join()?),
    })
}

/// The reduction of a Graph IR collective.
pub fn reduce_op(kind: ReduceKind) -> ReduceOp {
    match kind {
        ReduceKind::Sum => ReduceOp::Sum,
        ReduceKind::Max => ReduceOp::Max,
        ReduceKind::Min => ReduceOp::Min,
        ReduceKind::Mean => ReduceOp::Mean,
    }
}
