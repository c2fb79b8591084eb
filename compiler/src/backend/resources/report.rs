//! The report of what one kernel costs on one arch: the row, its occupancy
//! and diagnostics, and its table and JSON renderings.

use std::fmt::Write as _;

use serde_json::json;

use crate::backend::occupancy::{occupancy, BlockUsage, Carveout, Limiter, Occupancy};
use crate::diag::Diagnostic;
use crate::syntax::span::Span;
use crate::target::Arch;

/// What one kernel costs on one arch.
#[derive(Clone, Debug, PartialEq)]
pub struct Resources {
    pub kernel: String,
    pub arch: Arch,
    pub threads: u32,
    /// Estimated registers per thread (may exceed the arch's maximum: a spill).
    pub regs: u32,
    /// Shared memory per block in bytes (static and dynamic).
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
        self.diagnostics_hiding(span, false)
    }

    /// [`Resources::diagnostics`] of a kernel that does or does not hide
    /// memory latency within a warp (`target::Kernel::hides_latency`): low
    /// occupancy is W0004 (a warning) where nothing else hides latency, and
    /// the note W0006 where tensor cores or pipelined copies do, since such
    /// kernels are fast at low occupancy and a warning there would teach
    /// users to ignore W0004.
    pub fn diagnostics_hiding(&self, span: Span, hides_latency: bool) -> Vec<Diagnostic> {
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
        } else if occ.occupancy() < 0.25 && hides_latency {
            out.push(
                Diagnostic::new(
                    "W0006",
                    span,
                    format!(
                        "kernel `{}` has {:.1}% occupancy on {} ({} warps of {} per SM), limited by {}; its tensor-core or pipelined loop hides memory latency",
                        self.kernel,
                        occ.occupancy() * 100.0,
                        info.name,
                        occ.active_warps,
                        occ.max_warps_per_sm,
                        occ.limiter().name().replace('_', " ")
                    ),
                )
                .with_primary_label("low occupancy, latency hidden")
                .with_help("no action needed: tensor-core and software-pipelined kernels (cuBLAS's GEMMs too) run well at 12-25%; measure before trading tile size for occupancy"),
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
            if i + 1 == row.len() {
                let _ = writeln!(out, "{c}");
            } else if i < 2 {
                let _ = write!(out, "{c:<w$}  ");
            } else {
                let _ = write!(out, "{c:>w$}  ");
            }
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
