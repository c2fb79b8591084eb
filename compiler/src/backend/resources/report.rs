//! The report of what one kernel costs on one arch: the row, its occupancy
//! and diagnostics, and its table and JSON renderings.

use std::fmt::Write as _;

use serde_json::json;

use crate::backend::occupancy::{
    amd_occupancy, occupancy, AmdUsage, BlockUsage, Carveout, Limiter, Occupancy,
};
use crate::diag::Diagnostic;
use crate::syntax::span::Span;
use crate::target::Arch;

/// What one kernel costs on one arch.
#[derive(Clone, Debug, PartialEq)]
pub struct Resources {
    pub kernel: String,
    pub arch: Arch,
    pub threads: u32,
    /// Estimated registers per thread (AMD: architectural VGPRs a lane; may
    /// exceed the arch's maximum: a spill).
    pub regs: u32,
    /// AMD: the registers of CDNA's MFMA accumulators (AGPRs) and the scalar
    /// registers of a wave (`None` on NVIDIA).
    pub amd: Option<AmdRegs>,
    /// Shared memory per block in bytes (static and dynamic).
    pub smem_bytes: u32,
    /// Occupancy at `min(regs, max_regs_in_block)`: beyond the most a thread
    /// of the block can have, ptxas (LLVM) spills rather than refusing the
    /// kernel.
    pub occupancy: Occupancy,
}

/// An AMD kernel's registers besides its VGPRs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmdRegs {
    /// Accumulation VGPRs a lane (0 where the kernel uses none, and on RDNA).
    pub agprs: u32,
    /// Scalar registers a wave, VCC and the other extra SGPRs included.
    pub sgprs: u32,
}

impl Resources {
    pub fn new(
        kernel: impl Into<String>,
        arch: Arch,
        threads: u32,
        regs: u32,
        smem_bytes: u32,
    ) -> Self {
        let max = crate::backend::occupancy::max_regs_in_block(arch, threads);
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
            amd: None,
            smem_bytes,
            occupancy,
        }
    }

    /// The resources of a kernel on an AMD arch: `vgprs` architectural VGPRs
    /// and `regs.agprs` AGPRs a lane, `regs.sgprs` SGPRs a wave. Occupancy is
    /// computed at the registers LLVM would allocate: VGPRs and AGPRs beyond
    /// their files are spilled, SGPRs beyond what the other resources'
    /// occupancy leaves go to VGPR lanes.
    pub fn amd(
        kernel: impl Into<String>,
        arch: Arch,
        threads: u32,
        vgprs: u32,
        regs: AmdRegs,
        smem_bytes: u32,
    ) -> Self {
        let amd = arch
            .info()
            .amd
            .expect("Resources::amd is called for AMD arches, whose rows have `amd`");
        let usage = AmdUsage {
            threads,
            // Past the architectural VGPRs, CDNA's LLVM spills to AGPRs.
            vgprs: vgprs.min(amd.arch_vgprs),
            agprs: (regs.agprs + vgprs.saturating_sub(amd.arch_vgprs)).min(amd.agprs),
            sgprs: 0,
            lds_bytes: smem_bytes,
        };
        // LLVM keeps SGPRs within what the occupancy the other resources
        // allow leaves, spilling the rest into VGPR lanes rather than losing
        // a wave (clang-19, gfx90a: a grid-stride loop over 48 pointers, 96
        // SGPRs, 24 spilled, 8 waves).
        let waves = amd_occupancy(arch, usage).waves_per_simd.unwrap_or(0);
        let budget = amd
            .sgpr_waves
            .iter()
            .rev()
            .find(|&&(_, w)| w >= waves)
            .map_or(amd.addressable_sgprs, |&(most, _)| most)
            .min(amd.addressable_sgprs);
        let occupancy = amd_occupancy(
            arch,
            AmdUsage {
                sgprs: regs.sgprs.min(budget),
                ..usage
            },
        );
        Resources {
            kernel: kernel.into(),
            arch,
            threads,
            regs: vgprs,
            amd: Some(regs),
            smem_bytes,
            occupancy,
        }
    }

    /// One JSON object: kernel, arch, threads, regs (AMD: VGPRs), smem_bytes
    /// (AMD: LDS), occupancy, blocks_per_sm (AMD: workgroups a CU), limiter;
    /// on AMD also sgprs, agprs (CDNA) and waves_per_simd.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = json!({
            "kernel": self.kernel,
            "arch": self.arch.name(),
            "threads": self.threads,
            "regs": self.regs,
            "smem_bytes": self.smem_bytes,
            "occupancy": self.occupancy.occupancy(),
            "blocks_per_sm": self.occupancy.blocks_per_sm,
            "limiter": self.occupancy.limiter().name(),
        });
        if let (Some(amd), Some(waves)) = (self.amd, self.occupancy.waves_per_simd) {
            let o = v.as_object_mut().expect("a JSON object");
            o.insert("sgprs".into(), amd.sgprs.into());
            if self.arch.info().amd.is_some_and(|a| a.agprs > 0) {
                o.insert("agprs".into(), amd.agprs.into());
            }
            o.insert("waves_per_simd".into(), waves.into());
        }
        v
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
        let amd = info.amd;
        let regs_word = if amd.is_some() { "VGPRs" } else { "registers" };
        // Registers beyond what a thread can have: on AMD the VGPRs and
        // AGPRs together (CDNA's LLVM first moves VGPRs into AGPRs, which is
        // no spill to memory).
        let spill_at = match amd {
            Some(a) => a.addressable_vgprs,
            None => crate::backend::occupancy::max_regs_in_block(self.arch, self.threads),
        };
        // Where the block's size, not the arch, sets the limit, say so.
        let whose = if amd.is_none() && spill_at < info.max_regs_per_thread {
            format!("a thread of a {}-thread block", self.threads)
        } else {
            "a thread".to_string()
        };
        let regs_held = self.regs + self.amd.map_or(0, |a| a.agprs);
        if regs_held > spill_at {
            out.push(
                Diagnostic::new(
                    "W0003",
                    span,
                    format!(
                        "kernel `{}` likely spills registers on {}: an estimated {regs_held} {regs_word} per thread, more than the {spill_at} {whose} can have",
                        self.kernel, info.name
                    ),
                )
                .with_help(if whose == "a thread" {
                    "use smaller tiles or more warps (`num_warps=`) so that each thread holds fewer elements"
                } else {
                    "use smaller tiles so that each thread holds fewer elements, or fewer warps (`num_warps=`) so that each may have more registers"
                }),
            );
        }
        if let (Some(a), Some(r)) = (amd, self.amd) {
            if r.sgprs > a.addressable_sgprs {
                out.push(
                    Diagnostic::new(
                        "W0007",
                        span,
                        format!(
                            "kernel `{}` likely spills scalar registers on {}: an estimated {} SGPRs per wave, more than the {} a wave can address",
                            self.kernel, info.name, r.sgprs, a.addressable_sgprs
                        ),
                    )
                    .with_help("LLVM moves the excess SGPRs into VGPR lanes, costing VGPRs and instructions; fewer kernel arguments or fewer values that are the same across the wave (block offsets, strides, loop bounds) need fewer"),
                );
            }
        }
        if occ.cannot_launch() {
            let limiter = occ.limiter();
            let (code, what) = match limiter {
                Limiter::Warps | Limiter::Blocks => (
                    "E0604",
                    format!("{} threads per block, more than the {} of {}", self.threads, info.max_threads_per_block, info.name),
                ),
                Limiter::Registers | Limiter::ScalarRegisters => (
                    "E0602",
                    format!(
                        "{} registers per block ({} threads x {} registers, allocated per warp), more than the {} of {}",
                        occ.regs_per_block,
                        self.threads,
                        self.regs.min(crate::backend::occupancy::max_regs_in_block(self.arch, self.threads)),
                        info.regs_per_block,
                        info.name
                    ),
                ),
                Limiter::SharedMemory if amd.is_some() => (
                    "E0603",
                    format!(
                        "{} bytes of LDS per workgroup, more than the {} a workgroup can use on {}",
                        occ.smem_per_block, info.max_smem_per_block, info.name
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
            let how = match occ.waves_per_simd {
                Some(waves) => format!(
                    "{waves} wave{} of {} per SIMD",
                    if waves == 1 { "" } else { "s" },
                    amd.map_or(0, |a| a.max_waves_per_simd)
                ),
                None => format!(
                    "{} warps of {} per SM",
                    occ.active_warps, occ.max_warps_per_sm
                ),
            };
            let limiter = occ.limiter().name().replace('_', " ");
            let limiter = match (amd.is_some(), occ.limiter()) {
                (true, Limiter::Registers) => "VGPRs".to_string(),
                (true, Limiter::ScalarRegisters) => "SGPRs".to_string(),
                (true, Limiter::SharedMemory) => "LDS".to_string(),
                _ => limiter,
            };
            if hides_latency {
                out.push(
                    Diagnostic::new(
                        "W0006",
                        span,
                        format!(
                            "kernel `{}` has {:.1}% occupancy on {} ({how}), limited by {limiter}; its tensor-core or pipelined loop hides memory latency",
                            self.kernel,
                            occ.occupancy() * 100.0,
                            info.name,
                        ),
                    )
                    .with_primary_label("low occupancy, latency hidden")
                    .with_help("no action needed: tensor-core and software-pipelined kernels (cuBLAS's GEMMs too) run well at 12-25%; measure before trading tile size for occupancy"),
                );
            } else {
                out.push(
                    Diagnostic::new(
                        "W0004",
                        span,
                        format!(
                            "kernel `{}` has {:.1}% occupancy on {} ({how}), limited by {limiter}",
                            self.kernel,
                            occ.occupancy() * 100.0,
                            info.name,
                        ),
                    )
                    .with_help(match occ.limiter() {
                        Limiter::Registers => "fewer live values per thread (smaller tiles, or more warps) raise occupancy",
                        Limiter::ScalarRegisters => "fewer kernel arguments and wave-uniform values raise occupancy",
                        Limiter::SharedMemory => "smaller dot tiles or fewer pipeline stages (`num_stages=`) use less shared memory",
                        Limiter::Warps | Limiter::Blocks => "more warps per block (`num_warps=`) raise occupancy",
                    }),
                );
            }
        }
        out
    }
}

/// The report as a table: one row per kernel; with AMD rows, also their
/// SGPRs, AGPRs (CDNA) and waves per SIMD (`regs` is then VGPRs, `blocks/SM`
/// workgroups a CU).
pub fn render_table(rows: &[Resources]) -> String {
    let any_amd = rows.iter().any(|r| r.amd.is_some());
    let mut header = vec![
        "kernel",
        "arch",
        "threads",
        "regs",
        "smem_bytes",
        "occupancy",
        "blocks/SM",
    ];
    if any_amd {
        header.extend(["sgprs", "agprs", "waves/SIMD"]);
    }
    header.push("limiter");
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.kernel.clone(),
                r.arch.name().to_string(),
                r.threads.to_string(),
                r.regs.to_string(),
                r.smem_bytes.to_string(),
                format!("{:.1}%", r.occupancy.occupancy() * 100.0),
                r.occupancy.blocks_per_sm.to_string(),
            ];
            if any_amd {
                let has_agprs = r.arch.info().amd.is_some_and(|a| a.agprs > 0);
                let or_dash = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
                row.push(or_dash(r.amd.map(|a| a.sgprs)));
                row.push(or_dash(r.amd.filter(|_| has_agprs).map(|a| a.agprs)));
                row.push(or_dash(r.occupancy.waves_per_simd));
            }
            row.push(
                r.occupancy
                    .limiters()
                    .iter()
                    .map(|l| l.name())
                    .collect::<Vec<_>>()
                    .join("+"),
            );
            row
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, row: &[&str]| {
        for (i, (c, w)) in row.iter().zip(&widths).enumerate() {
            let w = *w;
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
