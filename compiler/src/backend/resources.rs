//! Resource report: what one kernel costs on one arch.
//!
//! * threads per block: `num_warps * warp_size`;
//! * registers per thread: the peak of 32-bit register pressure of the per-thread
//!   program ([`max_pressure`]), from liveness over a structured program
//!   ([`Node`]: instructions, loops, two-way branches), which Target IR is;
//! * static shared memory in bytes;
//! * occupancy and its limiting factor, by [`super::occupancy`].
//!
//! # Register estimate
//!
//! Every virtual register has a width in 32-bit words (predicates: 0, 64-bit: 2)
//! and a live interval over the program's instructions in order, from its first
//! definition to its last use. Loops widen intervals, as the back edge demands:
//! a register defined before a loop and read inside it lives to the loop's end;
//! a register read in a loop before the loop (re)defines it (carried), or defined
//! in a loop and read after it, lives through the whole loop. Branches need
//! nothing special: the two arms are laid out one after the other, so a value
//! live across the `if` spans both, and values local to one arm never overlap the
//! other's. At each instruction the pressure is the words of every register live
//! across it plus those it defines (a result may reuse the register of an operand
//! read for the last time). The estimate is the peak, plus the registers ptxas
//! keeps for itself ([`PTXAS_OVERHEAD`]), at least [`MIN_REGS`].

use std::fmt::Write as _;

use serde_json::json;

use super::arch::Arch;
use super::occupancy::{occupancy, BlockUsage, Carveout, Limiter, Occupancy};
use crate::diag::Diagnostic;
use crate::syntax::span::Span;

/// A structured per-thread program, as far as register liveness is concerned.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// One instruction: the registers it writes and reads.
    Inst { defs: Vec<u32>, uses: Vec<u32> },
    /// A loop: `entry` runs once before it (e.g. reading the bounds and writing the
    /// induction variable), then `body` repeats.
    Loop { entry: Box<Node>, body: Vec<Node> },
    /// A two-way branch on `cond`.
    Branch {
        cond: Vec<u32>,
        then: Vec<Node>,
        otherwise: Vec<Node>,
    },
}

/// Registers `ptxas -v` counts beyond the program's own values. Calibrated with
/// ptxas 12.9 on straight-line kernels holding `n` loaded values and a 64-bit
/// address live at once: it reports `n + 2 + 3` registers on sm_70, sm_80 and
/// sm_90 for every `n` from 3 to 24 (`compiler/tests/ptxas.rs` re-checks this).
pub const PTXAS_OVERHEAD: u32 = 3;
/// The fewest registers ptxas 12.9 reports for a kernel that touches global
/// memory (an empty kernel gets 4).
pub const MIN_REGS: u32 = 8;

#[derive(Clone, Copy, Debug, Default)]
struct Interval {
    first: Option<usize>,
    last: Option<usize>,
}

/// Program positions: one per instruction (and per branch condition, and per
/// empty loop body), in program order.
struct Linear {
    intervals: Vec<Interval>,
    pos: usize,
}

impl Linear {
    fn touch(&mut self, reg: u32, def: bool) {
        let i = reg as usize;
        if self.intervals.len() <= i {
            self.intervals.resize(i + 1, Interval::default());
        }
        let iv = &mut self.intervals[i];
        if def {
            iv.first = Some(iv.first.map_or(self.pos, |f| f.min(self.pos)));
        }
        iv.last = Some(iv.last.map_or(self.pos, |l| l.max(self.pos)));
    }

    fn inst(&mut self, defs: &[u32], uses: &[u32]) {
        for &u in uses {
            self.touch(u, false);
        }
        for &d in defs {
            self.touch(d, true);
        }
        self.pos += 1;
    }

    fn walk(&mut self, nodes: &[Node]) {
        for n in nodes {
            match n {
                Node::Inst { defs, uses } => self.inst(defs, uses),
                Node::Loop { entry, body } => {
                    self.walk(std::slice::from_ref(entry));
                    let start = self.pos;
                    self.walk(body);
                    // An empty body still occupies one position.
                    self.pos = self.pos.max(start + 1);
                }
                Node::Branch {
                    cond,
                    then,
                    otherwise,
                } => {
                    self.inst(&[], cond);
                    self.walk(then);
                    self.walk(otherwise);
                }
            }
        }
    }
}

/// First def and first use of every register inside `nodes`, in program order.
fn first_events(nodes: &[Node], pos: &mut usize, out: &mut Events) {
    let note = |r: u32, def: bool, p: usize, out: &mut Events| {
        let i = r as usize;
        if out.len() <= i {
            out.resize(i + 1, (None, None));
        }
        let slot = if def { &mut out[i].0 } else { &mut out[i].1 };
        if slot.is_none() {
            *slot = Some(p);
        }
    };
    for n in nodes {
        match n {
            Node::Inst { defs, uses } => {
                for &u in uses {
                    note(u, false, *pos, out);
                }
                for &d in defs {
                    note(d, true, *pos, out);
                }
                *pos += 1;
            }
            Node::Loop { entry, body } => {
                first_events(std::slice::from_ref(entry), pos, out);
                let start = *pos;
                first_events(body, pos, out);
                *pos = (*pos).max(start + 1);
            }
            Node::Branch {
                cond,
                then,
                otherwise,
            } => {
                for &u in cond {
                    note(u, false, *pos, out);
                }
                *pos += 1;
                first_events(then, pos, out);
                first_events(otherwise, pos, out);
            }
        }
    }
}

/// First def and first use (positions) of each register inside a loop body.
type Events = Vec<(Option<usize>, Option<usize>)>;

/// Every loop as `(start, end, events)`, positions inclusive, inner loops first.
fn collect_loops(nodes: &[Node], pos: &mut usize, out: &mut Vec<(usize, usize, Events)>) {
    for n in nodes {
        match n {
            Node::Inst { .. } => *pos += 1,
            Node::Loop { entry, body } => {
                collect_loops(std::slice::from_ref(entry), pos, out);
                let start = *pos;
                let mut p = start;
                let mut events = Vec::new();
                first_events(body, &mut p, &mut events);
                collect_loops(body, pos, out);
                let end = (*pos).max(start + 1) - 1;
                *pos = end + 1;
                out.push((start, end, events));
            }
            Node::Branch {
                then, otherwise, ..
            } => {
                *pos += 1;
                collect_loops(then, pos, out);
                collect_loops(otherwise, pos, out);
            }
        }
    }
}

/// Peak 32-bit register pressure of a program whose register `r` is
/// `words(r)` words wide (see the module docs for the model).
pub fn max_pressure(program: &[Node], words: &dyn Fn(u32) -> u32) -> u32 {
    let mut lin = Linear {
        intervals: Vec::new(),
        pos: 0,
    };
    lin.walk(program);
    let npos = lin.pos;
    let mut loops = Vec::new();
    collect_loops(program, &mut 0, &mut loops);
    // Inner loops are pushed before the loops that contain them, so one pass in
    // order propagates widening outwards; repeat to a fixpoint for safety.
    let mut intervals = lin.intervals;
    loop {
        let mut changed = false;
        for (start, end, events) in &loops {
            let (start, end) = (*start, *end);
            for (r, iv) in intervals.iter_mut().enumerate() {
                let (Some(first), Some(last)) = (iv.first, iv.last) else {
                    continue;
                };
                let (def_in, use_in) = events.get(r).copied().unwrap_or((None, None));
                let mut f = first;
                let mut l = last;
                // Defined before, read inside: live to the end of the loop.
                if first < start && use_in.is_some() {
                    l = l.max(end);
                }
                // Read inside before the loop defines it: carried around the loop.
                if let (Some(u), Some(d)) = (use_in, def_in) {
                    if u <= d && first < start {
                        l = l.max(end);
                    } else if u <= d {
                        f = f.min(start);
                        l = l.max(end);
                    }
                }
                // Defined inside, read after: the value crosses the back edge.
                if def_in.is_some() && last > end {
                    f = f.min(start);
                }
                if (f, l) != (first, last) {
                    iv.first = Some(f);
                    iv.last = Some(l);
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    // A register used but never defined (a bug upstream, or an input) is live
    // from the start.
    let mut diff = vec![0i64; npos + 2];
    for (r, iv) in intervals.iter().enumerate() {
        let Some(last) = iv.last else { continue };
        let first = iv.first.unwrap_or(0);
        let w = words(r as u32) as i64;
        if w == 0 {
            continue;
        }
        // Live across [first, last): a value dies at its last use, whose result
        // may take its register; a value never read still occupies its definition.
        let end = last.max(first + 1);
        diff[first] += w;
        diff[end] -= w;
    }
    let mut cur = 0i64;
    let mut peak = 0i64;
    for d in diff.iter().take(npos + 1) {
        cur += d;
        peak = peak.max(cur);
    }
    peak as u32
}

/// The register estimate reported for a program: peak pressure plus ptxas's
/// overhead, at least [`MIN_REGS`].
pub fn estimate_regs(program: &[Node], words: &dyn Fn(u32) -> u32) -> u32 {
    (max_pressure(program, words) + PTXAS_OVERHEAD).max(MIN_REGS)
}

/// What one kernel costs on one arch.
#[derive(Clone, Debug, PartialEq)]
pub struct Resources {
    pub kernel: String,
    pub arch: Arch,
    pub threads: u32,
    /// Estimated registers per thread (may exceed the arch's maximum: a spill).
    pub regs: u32,
    /// Static shared memory in bytes.
    pub smem_bytes: u32,
    /// Occupancy at `min(regs, max_regs_per_thread)`: beyond the maximum ptxas
    /// spills rather than refusing the kernel.
    pub occupancy: Occupancy,
}

impl Resources {
    pub fn new(
        kernel: impl Into<String>,
        arch: Arch,
        threads: u32,
        regs: u32,
        smem_bytes: u32,
    ) -> Self {
        let max = arch.info().max_regs_per_thread;
        let occupancy = occupancy(
            arch,
            BlockUsage {
                threads,
                regs_per_thread: regs.min(max),
                smem_bytes,
            },
            Carveout::Default,
        );
        Resources {
            kernel: kernel.into(),
            arch,
            threads,
            regs,
            smem_bytes,
            occupancy,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "kernel": self.kernel,
            "arch": self.arch.name(),
            "threads": self.threads,
            "regs": self.regs,
            "smem_bytes": self.smem_bytes,
            "occupancy": self.occupancy.occupancy(),
            "blocks_per_sm": self.occupancy.blocks_per_sm,
            "limiter": self.occupancy.limiter().name(),
        })
    }

    /// W0003 (likely spill), W0004 (occupancy under 25%) and, when not one block
    /// fits on an SM, the E06xx error of the resource that does not fit. `span`
    /// is where to point (the kernel's name).
    pub fn diagnostics(&self, span: Span) -> Vec<Diagnostic> {
        let info = self.arch.info();
        let mut out = Vec::new();
        let occ = &self.occupancy;
        if self.regs > info.max_regs_per_thread {
            out.push(
                Diagnostic::new(
                    "W0003",
                    span,
                    format!(
                        "kernel `{}` likely spills registers on {}: an estimated {} registers per thread, more than the {} a thread can have",
                        self.kernel, info.name, self.regs, info.max_regs_per_thread
                    ),
                )
                .with_help("use smaller tiles or more warps (`num_warps=`) so that each thread holds fewer elements"),
            );
        }
        if occ.blocks_per_sm == 0 {
            let limiter = occ.limiter();
            let (code, what) = match limiter {
                Limiter::Warps | Limiter::Blocks => (
                    "E0604",
                    format!("{} threads per block, more than the {} of {}", self.threads, info.max_threads_per_block, info.name),
                ),
                Limiter::Registers => (
                    "E0602",
                    format!(
                        "{} registers per block ({} threads x {} registers, allocated per warp), more than the {} of {}",
                        occ.regs_per_block,
                        self.threads,
                        self.regs.min(info.max_regs_per_thread),
                        info.regs_per_block,
                        info.name
                    ),
                ),
                Limiter::SharedMemory => (
                    "E0603",
                    format!(
                        "{} bytes of shared memory per block (with the driver's reserve), more than the {} a block can use on {}",
                        occ.smem_per_block,
                        info.max_smem_per_block + info.smem_reserved_per_block,
                        info.name
                    ),
                ),
            };
            out.push(
                Diagnostic::new(
                    code,
                    span,
                    format!(
                        "kernel `{}` cannot run on {}: {what}",
                        self.kernel, info.name
                    ),
                )
                .with_help(
                    "use smaller tiles, fewer pipeline stages (`num_stages=`) or fewer warps",
                ),
            );
        } else if occ.occupancy() < 0.25 {
            out.push(
                Diagnostic::new(
                    "W0004",
                    span,
                    format!(
                        "kernel `{}` has {:.1}% occupancy on {} ({} warps of {} per SM), limited by {}",
                        self.kernel,
                        occ.occupancy() * 100.0,
                        info.name,
                        occ.active_warps,
                        occ.max_warps_per_sm,
                        occ.limiter().name().replace('_', " ")
                    ),
                )
                .with_help(match occ.limiter() {
                    Limiter::Registers => "fewer live values per thread (smaller tiles, or more warps) raise occupancy",
                    Limiter::SharedMemory => "smaller dot tiles or fewer pipeline stages (`num_stages=`) use less shared memory",
                    Limiter::Warps | Limiter::Blocks => "more warps per block (`num_warps=`) raise occupancy",
                }),
            );
        }
        out
    }
}

/// The report as a table: one row per kernel.
pub fn render_table(rows: &[Resources]) -> String {
    let header = [
        "kernel",
        "arch",
        "threads",
        "regs",
        "smem_bytes",
        "occupancy",
        "blocks/SM",
        "limiter",
    ];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.kernel.clone(),
                r.arch.name().to_string(),
                r.threads.to_string(),
                r.regs.to_string(),
                r.smem_bytes.to_string(),
                format!("{:.1}%", r.occupancy.occupancy() * 100.0),
                r.occupancy.blocks_per_sm.to_string(),
                r.occupancy
                    .limiters()
                    .iter()
                    .map(|l| l.name())
                    .collect::<Vec<_>>()
                    .join("+"),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, row: &[&str]| {
        for (i, (c, w)) in row.iter().zip(widths).enumerate() {
            // Text left-aligned, numbers right-aligned.
            if i < 2 || i == 7 {
                let _ = write!(out, "{c:<w$}");
            } else {
                let _ = write!(out, "{c:>w$}");
            }
            out.push_str(if i + 1 < row.len() { "  " } else { "\n" });
        }
    };
    line(&mut out, &header);
    for row in &cells {
        let r: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&mut out, &r);
    }
    out
}

/// The report as JSON: an array of objects.
pub fn render_json(rows: &[Resources]) -> String {
    let v: Vec<serde_json::Value> = rows.iter().map(Resources::to_json).collect();
    serde_json::to_string_pretty(&v).expect("JSON of plain values")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(defs: &[u32], uses: &[u32]) -> Node {
        Node::Inst {
            defs: defs.to_vec(),
            uses: uses.to_vec(),
        }
    }

    fn one(_: u32) -> u32 {
        1
    }

    #[test]
    fn straight_line_results_reuse_dead_operands() {
        // r0, r1 params; r2 = r0 + r1; r3 = r2 * r2; store r3.
        let p = [
            inst(&[0], &[]),
            inst(&[1], &[]),
            inst(&[2], &[0, 1]),
            inst(&[3], &[2, 2]),
            inst(&[], &[3]),
        ];
        assert_eq!(max_pressure(&p, &one), 2);
        // A value never read still needs a register where it is written.
        assert_eq!(max_pressure(&[inst(&[0], &[])], &one), 1);
        assert_eq!(max_pressure(&[], &one), 0);
    }

    #[test]
    fn widths_count_words_and_predicates_are_free() {
        // r0: 64-bit address, r1: pred, r2: f32 loaded under r1.
        let p = [
            inst(&[0], &[]),
            inst(&[1], &[]),
            inst(&[2], &[0, 1]),
            inst(&[], &[0, 2]),
        ];
        let words = |r: u32| [2, 0, 1][r as usize];
        assert_eq!(max_pressure(&p, &words), 3);
    }

    #[test]
    fn values_read_in_a_loop_live_through_it() {
        // r0 defined before the loop and read at the start of the body: it must
        // survive the whole body (the next iteration reads it again), so it
        // overlaps the 3 temporaries made at the end of the body.
        let p = [
            inst(&[0], &[]),
            Node::Loop {
                entry: Box::new(inst(&[1], &[])),
                body: vec![
                    inst(&[2], &[0, 1]),
                    inst(&[], &[2]),
                    inst(&[3], &[]),
                    inst(&[4], &[]),
                    inst(&[5], &[3, 4]),
                    inst(&[], &[5]),
                ],
            },
        ];
        // At r4's definition: r0, r1 (the induction variable, read at the body's
        // start), r3, r4.
        assert_eq!(max_pressure(&p, &one), 4);
        // Without the loop the same instructions need one register less: r0
        // dies at its only read.
        let flat = [
            inst(&[0], &[]),
            inst(&[1], &[]),
            inst(&[2], &[0, 1]),
            inst(&[], &[2]),
            inst(&[3], &[]),
            inst(&[4], &[]),
            inst(&[5], &[3, 4]),
            inst(&[], &[5]),
        ];
        assert_eq!(max_pressure(&flat, &one), 2);
    }

    #[test]
    fn carried_and_escaping_values_span_the_loop() {
        // r1 is written late in the body and read after the loop: it crosses
        // the back edge, so it is live while r2, r3 are (early in the body).
        let p = [
            Node::Loop {
                entry: Box::new(inst(&[0], &[])),
                body: vec![
                    inst(&[2], &[0]),
                    inst(&[3], &[2]),
                    inst(&[], &[3]),
                    inst(&[1], &[0]),
                ],
            },
            inst(&[], &[1]),
        ];
        assert_eq!(max_pressure(&p, &one), 3);
        // Accumulator: defined before, read and rewritten inside, read after.
        let acc = [
            inst(&[0], &[]),
            Node::Loop {
                entry: Box::new(inst(&[1], &[])),
                body: vec![inst(&[2], &[1]), inst(&[3], &[0, 2]), inst(&[0], &[3])],
            },
            inst(&[], &[0]),
        ];
        // r0, r1 and r2 at r2's definition; r3 replaces r2.
        assert_eq!(max_pressure(&acc, &one), 3);
    }

    #[test]
    fn branch_arms_do_not_add_up() {
        let arm = |base: u32| {
            vec![
                inst(&[base], &[]),
                inst(&[base + 1], &[]),
                inst(&[base + 2], &[]),
                inst(&[], &[base, base + 1, base + 2]),
            ]
        };
        let p = [
            inst(&[0], &[]),
            Node::Branch {
                cond: vec![0],
                then: arm(1),
                otherwise: arm(4),
            },
        ];
        assert_eq!(max_pressure(&p, &one), 3);
        // A value live across the branch adds to both arms.
        let mut q = p.to_vec();
        q.push(inst(&[], &[0]));
        assert_eq!(max_pressure(&q, &one), 4);
    }

    #[test]
    fn estimate_has_a_floor() {
        assert_eq!(estimate_regs(&[inst(&[0], &[])], &one), MIN_REGS);
    }

    fn usage(threads: u32, regs: u32, smem: u32) -> Resources {
        Resources::new("k", Arch::Sm90, threads, regs, smem)
    }

    #[test]
    fn warnings_and_errors() {
        let span = Span::new(4, 5);
        let codes = |r: &Resources| {
            r.diagnostics(span)
                .iter()
                .map(|d| d.code)
                .collect::<Vec<_>>()
        };
        // 128 threads, 32 regs: 16 blocks, 100%.
        assert!(codes(&usage(128, 32, 0)).is_empty());
        // 300 registers: a spill; occupancy is computed at 255 (2 blocks of 4
        // warps = 12.5%), so W0004 as well.
        let r = usage(128, 300, 0);
        assert_eq!(r.occupancy.blocks_per_sm, 2);
        assert_eq!(codes(&r), ["W0003", "W0004"]);
        // 200 KiB of shared memory: 1 block of 4 warps (6.25%), limited by it.
        let r = usage(128, 32, 200 * 1024);
        assert_eq!(codes(&r), ["W0004"]);
        assert!(
            r.diagnostics(span)[0].message.contains("shared memory"),
            "{:?}",
            r.diagnostics(span)
        );
        // 1024 threads x 128 registers cannot launch: E0602.
        assert_eq!(codes(&usage(1024, 128, 0)), ["E0602"]);
        assert_eq!(codes(&usage(128, 32, 230 * 1024)), ["E0603"]);
        assert_eq!(codes(&usage(2048, 16, 0)), ["E0604"]);
        // Exactly 25% is not under 25%: 16 warps of 64 (4 blocks x 4 warps).
        let r = usage(128, 32, 48 * 1024);
        assert_eq!(r.occupancy.occupancy(), 0.25);
        assert!(codes(&r).is_empty());
    }

    #[test]
    fn json_and_table() {
        let rows = [
            usage(128, 40, 16384),
            Resources::new("flash_attn", Arch::Sm80, 256, 168, 49152),
        ];
        let v: serde_json::Value = serde_json::from_str(&render_json(&rows)).unwrap();
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[1]["kernel"], "flash_attn");
        assert_eq!(a[1]["arch"], "sm_80");
        assert_eq!(a[1]["threads"], 256);
        assert_eq!(a[1]["regs"], 168);
        assert_eq!(a[1]["smem_bytes"], 49152);
        // 168 regs: 5376 a warp; 16384 / 5376 = 3 warps a sub-partition, 12 an
        // SM, 1 block of 8 warps: 12.5%.
        assert_eq!(a[1]["blocks_per_sm"], 1);
        assert_eq!(a[1]["occupancy"], 0.125);
        assert_eq!(a[1]["limiter"], "registers");
        let t = render_table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("kernel"));
        assert!(lines[2].starts_with("flash_attn  sm_80"), "{t}");
        assert!(lines[2].ends_with("registers"), "{t}");
    }
}
