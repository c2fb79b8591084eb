//! Dot operands packed once per launch and shared by its programs.
//!
//! The programs of a gemm grid load the same tiles over and over: every
//! program of a row block reads the same rows of A, every program of a column
//! block the same columns of B, and each would pack (convert, round, lay out
//! for the micro-kernel) them again, reading them from memory in short runs
//! on many pages. A launch instead keeps each operand it packed, keyed by the
//! tensor memory it came from, and later programs read the packed copy in one
//! contiguous run. Only views of tensors that no program of the launch writes
//! are kept (see `Mem::read_only`), so a packed copy always holds what packing
//! the memory again would give. The cache is bounded; past the bound,
//! operands are packed per dot as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use super::gemm::View;
use crate::check::DType;

/// At most this many bytes of packed operands per launch.
const BUDGET_BYTES: usize = 64 << 20;

/// `len` f32 from a 64-byte boundary on, so that a vector load of a packed
/// row never straddles two cache lines.
pub(super) struct Packed {
    buf: Vec<f32>,
    at: usize,
    len: usize,
}

impl Packed {
    pub fn zeroed(len: usize) -> Packed {
        let mut buf = Vec::new();
        let at = aligned(&mut buf, len);
        Packed { buf, at, len }
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.buf[self.at..self.at + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.buf[self.at..self.at + self.len]
    }
}

/// Resizes `v` to hold `len` zeroed f32 from a 64-byte boundary on and
/// returns where they start.
pub(super) fn aligned(v: &mut Vec<f32>, len: usize) -> usize {
    v.clear();
    v.resize(len + 16, 0.0);
    v.as_ptr().align_offset(64).min(16)
}

/// Which operand of a chain of dots, in which layout.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) enum Side {
    /// `a` as rows of the summed `k`.
    Rows,
    /// `b` in panels of this many columns.
    Panels(usize),
}

/// Where a packed operand came from: the views of its parts, in order.
#[derive(PartialEq, Eq, Hash, Debug)]
pub(super) struct Key {
    side: Side,
    tf32: bool,
    parts: Vec<ViewKey>,
}

#[derive(PartialEq, Eq, Hash, Debug)]
struct ViewKey {
    ptr: usize,
    dtype: DType,
    off: i64,
    strides: (i64, i64),
    rows: (usize, usize),
    cols: (usize, usize),
    fill: u32,
    k: usize,
}

impl Key {
    /// The key of a chain's operand, when every part of it is a view of a
    /// tensor the launch does not write.
    pub fn of(
        views: impl Iterator<Item = Option<(View, usize)>>,
        side: Side,
        tf32: bool,
    ) -> Option<Key> {
        let parts = views
            .map(|v| {
                let (v, k) = v?;
                v.read_only.then_some(ViewKey {
                    ptr: v.ptr as usize,
                    dtype: v.dtype,
                    off: v.off,
                    strides: (v.rs, v.cs),
                    rows: v.rows,
                    cols: v.cols,
                    fill: v.fill.to_bits(),
                    k,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Key { side, tf32, parts })
    }
}

/// The packed operands of one launch.
pub(super) struct PackCache {
    /// Fx rather than SipHash: keys are long and come from the kernel, not
    /// from an adversary.
    map: Mutex<FxHashMap<Key, Arc<Packed>>>,
    bytes: AtomicUsize,
}

impl PackCache {
    pub fn new() -> PackCache {
        PackCache {
            map: Mutex::new(FxHashMap::default()),
            bytes: AtomicUsize::new(0),
        }
    }

    /// The operand packed under `key`, packed by `pack` into `len` zeroed
    /// f32 if it is not there yet; `None` once the cache is full.
    pub fn get_or_pack(
        &self,
        key: Key,
        len: usize,
        pack: impl FnOnce(&mut [f32]),
    ) -> Option<Arc<Packed>> {
        // A poisoned lock only means another program panicked mid-insert;
        // the map itself is still whole.
        let map = || self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map().get(&key) {
            return Some(p.clone());
        }
        if self.bytes.fetch_add(len * 4, Ordering::Relaxed) + len * 4 > BUDGET_BYTES {
            self.bytes.fetch_sub(len * 4, Ordering::Relaxed);
            return None;
        }
        // Packed outside the lock; two programs may race to pack the same
        // operand, with the same result, and the first one kept.
        let mut p = Packed::zeroed(len);
        pack(p.as_mut_slice());
        Some(map().entry(key).or_insert_with(|| Arc::new(p)).clone())
    }
}
