//! Register pressure of a structured program: liveness over its control-flow
//! graph, and the estimate reported from the peak.

use super::{work, Node};
use crate::target::ptxas::{MIN_REGS, PTXAS_OVERHEAD};

/// The control-flow graph of a program: per position, what it writes and reads
/// and where control goes next.
#[derive(Default)]
pub(super) struct Cfg {
    pub(super) defs: Vec<Vec<u32>>,
    pub(super) uses: Vec<Vec<u32>>,
    pub(super) succ: Vec<Vec<usize>>,
    /// Exits (test positions) of each loop being built, innermost last.
    exits: Vec<Vec<usize>>,
}

impl Cfg {
    fn position(&mut self, defs: &[u32], uses: &[u32]) -> usize {
        self.defs.push(defs.to_vec());
        self.uses.push(uses.to_vec());
        self.succ.push(Vec::new());
        self.defs.len() - 1
    }

    fn link(&mut self, from: &[usize], to: usize) {
        for &f in from {
            self.succ[f].push(to);
        }
    }

    /// Builds `nodes` in sequence; returns the first position (if any) and the
    /// positions whose successor is whatever follows.
    pub(super) fn seq(&mut self, nodes: &[Node]) -> (Option<usize>, Vec<usize>) {
        let mut first = None;
        let mut open: Vec<usize> = Vec::new();
        for n in nodes {
            let (entry, out) = self.node(n);
            if first.is_none() {
                first = Some(entry);
            } else {
                self.link(&open, entry);
            }
            open = out;
        }
        (first, open)
    }

    fn node(&mut self, n: &Node) -> (usize, Vec<usize>) {
        match n {
            Node::Inst { defs, uses } => {
                let p = self.position(defs, uses);
                (p, vec![p])
            }
            Node::Test { uses } => {
                let p = self.position(&[], uses);
                if let Some(exits) = self.exits.last_mut() {
                    exits.push(p);
                }
                (p, vec![p])
            }
            Node::Loop { entry, body } => {
                let (e, mut out) = self.node(entry);
                self.exits.push(Vec::new());
                let (start, end) = self.seq(body);
                let exits = self.exits.pop().unwrap_or_default();
                if let Some(start) = start {
                    self.link(&out, start);
                    self.link(&end, start);
                }
                // Skipped after the entry, or left at a test.
                out.extend(exits);
                (e, out)
            }
            Node::Branch {
                cond,
                then,
                otherwise,
            } => {
                let p = self.position(&[], cond);
                let mut out = Vec::new();
                for arm in [then, otherwise] {
                    match self.seq(arm) {
                        (Some(first), end) => {
                            self.link(&[p], first);
                            out.extend(end);
                        }
                        (None, _) => out.push(p),
                    }
                }
                (p, out)
            }
        }
    }
}

/// A set of registers as bits, with the total width of its members and the
/// words of the bit array it has touched since it was last cleared (so that
/// clearing costs what was inserted, not the size of the register file).
struct LiveSet {
    bits: Vec<u64>,
    touched: Vec<usize>,
    weight: u64,
}

impl LiveSet {
    fn new(nregs: usize) -> Self {
        LiveSet {
            bits: vec![0; nregs.div_ceil(64)],
            touched: Vec::new(),
            weight: 0,
        }
    }
    fn insert(&mut self, r: u32, words: &dyn Fn(u32) -> u32) {
        let w = &mut self.bits[r as usize / 64];
        if *w & (1 << (r % 64)) == 0 {
            if *w == 0 {
                self.touched.push(r as usize / 64);
            }
            *w |= 1 << (r % 64);
            self.weight += u64::from(words(r));
        }
    }
    fn remove(&mut self, r: u32, words: &dyn Fn(u32) -> u32) {
        let w = &mut self.bits[r as usize / 64];
        if *w & (1 << (r % 64)) != 0 {
            *w &= !(1 << (r % 64));
            self.weight -= u64::from(words(r));
        }
    }
    fn clear(&mut self) {
        work(self.touched.len());
        for i in self.touched.drain(..) {
            self.bits[i] = 0;
        }
        self.weight = 0;
    }
    /// The members, ascending.
    fn members(&mut self) -> Vec<u32> {
        work(self.touched.len());
        self.touched.sort_unstable();
        self.touched.dedup();
        self.touched.retain(|&i| self.bits[i] != 0);
        let mut out = Vec::new();
        for &i in &self.touched {
            let mut rest = self.bits[i];
            while rest != 0 {
                work(1);
                out.push((i * 64) as u32 + rest.trailing_zeros());
                rest &= rest - 1;
            }
        }
        out
    }
}

/// Peak 32-bit register pressure of a program whose register `r` is
/// `words(r)` words wide (see the module docs for the model).
///
/// Liveness runs backward over the positions with one running set: a
/// position whose only successor is the next one takes that one's live-in
/// set as it stands, so only jump targets (loop starts, the first position of
/// a branch's second arm, the positions after loops and branches) keep a copy
/// of their live-in set between sweeps. Sweeps repeat until those copies stop
/// changing (loop nesting depth + 2 sweeps for structured code), and each
/// sweep costs the program's length plus the sizes of the sets it copies, not
/// positions times registers.
pub fn max_pressure(program: &[Node], words: &dyn Fn(u32) -> u32) -> u32 {
    let mut cfg = Cfg::default();
    cfg.seq(program);
    let n = cfg.defs.len();
    let nregs = cfg
        .defs
        .iter()
        .chain(&cfg.uses)
        .flatten()
        .map(|&r| r as usize + 1)
        .max()
        .unwrap_or(0);
    // Positions reached other than by falling through from the one before.
    let mut target = vec![false; n];
    for (p, succ) in cfg.succ.iter().enumerate() {
        for &s in succ {
            if s != p + 1 {
                target[s] = true;
            }
        }
    }
    let mut saved: Vec<Option<Vec<u32>>> = vec![None; n];
    let mut live = LiveSet::new(nregs);
    loop {
        let mut changed = false;
        let mut peak = 0u64;
        live.clear();
        for p in (0..n).rev() {
            crate::cancel::checkpoint();
            work(1 + cfg.succ[p].len() + cfg.defs[p].len() + cfg.uses[p].len());
            // `live` is the live-in set of p + 1: make it p's live-out set.
            if !cfg.succ[p].contains(&(p + 1)) {
                live.clear();
            }
            for &s in &cfg.succ[p] {
                if s != p + 1 {
                    work(saved[s].as_ref().map_or(0, Vec::len));
                    for &r in saved[s].iter().flatten() {
                        live.insert(r, words);
                    }
                }
            }
            for &d in &cfg.defs[p] {
                live.insert(d, words);
            }
            let with_defs = live.weight;
            for &d in &cfg.defs[p] {
                live.remove(d, words);
            }
            for &u in &cfg.uses[p] {
                live.insert(u, words);
            }
            peak = peak.max(with_defs).max(live.weight);
            if target[p] {
                let members = live.members();
                if saved[p].as_ref() != Some(&members) {
                    saved[p] = Some(members);
                    changed = true;
                }
            }
        }
        if !changed {
            return u32::try_from(peak).unwrap_or(u32::MAX);
        }
    }
}

/// The register estimate reported for a program: peak pressure plus ptxas's
/// overhead, at least [`MIN_REGS`].
pub fn estimate_regs(program: &[Node], words: &dyn Fn(u32) -> u32) -> u32 {
    (max_pressure(program, words) + PTXAS_OVERHEAD).max(MIN_REGS)
}
