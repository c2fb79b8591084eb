//! Validation of the AMD resource model against clang-19's AMDGPU backend:
//! HIP goes through `clang++-19 -x hip --cuda-device-only -nogpulib
//! -nogpuinc -O3 -Rpass-analysis=kernel-resource-usage` (the compiler named
//! by `TESSERA_CLANG`, else `clang++-19` on the `PATH`) for gfx90a, gfx942
//! and gfx1100, and its remarks (VGPRs, AGPRs, SGPRs, LDS, occupancy in
//! waves per SIMD) are read back. Without clang the test is skipped with a
//! note, except under CI (`CI` set), where that is a failure.
//!
//! * probes: kernels that claim given VGPRs, AGPRs and SGPRs (inline-asm
//!   clobbers), LDS (a static array) and workgroup sizes: the occupancy
//!   `backend::occupancy::amd_occupancy` computes from clang's own counts
//!   must be clang's, on every probe;
//! * the corpus: every kernel of `stdlib/`, `examples/` and the `.tsr` files
//!   of `tests/` that check clean, through Target IR and the HIP printer:
//!   the VGPR estimate (`backend::resources::of_target`) beside clang's
//!   count, printed with the median, 90th percentile and worst error per
//!   arch against the goals (a median error within 15%, no kernel over 35%;
//!   the second not met yet: the test holds the estimate to where it
//!   stands, [`held`]);
//!   the LDS must be clang's, and the estimated waves per SIMD clang's
//!   wherever the estimate allocates as many VGPRs as clang (the same
//!   granules); a kernel the estimate says cannot run (LDS past 64 KiB)
//!   must be one clang refuses.
//!
//! `TESSERA_CLANG_ONLY=probes,corpus` runs only the named parts;
//! `TESSERA_CLANG_TABLE=1` prints every kernel's row.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use tessera::backend::occupancy::{amd_occupancy, AmdUsage};
use tessera::backend::resources;
use tessera::db::{file_kernels, tile_ir, Database};
use tessera::target::Arch;

use common::corpus::{specializations, tsr_files};

const ARCHS: [Arch; 3] = [Arch::Gfx90a, Arch::Gfx942, Arch::Gfx1100];

fn main() -> ExitCode {
    let clang = match common::tool_or_exit(configured(), "clang AMDGPU validation") {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut failures = Vec::new();
    let only = std::env::var("TESSERA_CLANG_ONLY").ok();
    let part = |name: &str| common::runs(only.as_deref(), name);
    if part("probes") {
        probes(&clang, &mut failures);
    }
    if part("corpus") {
        // With the compiler's stack, as the binaries run it (deeply nested
        // kernels of the fuzz findings under tests/).
        let mut found = Vec::new();
        tessera::stack::with_stack(|| corpus(&clang, &mut found)).expect("a thread for the corpus");
        failures.extend(found);
    }
    common::finish(&failures)
}

/// The clang to run: `TESSERA_CLANG`, else `clang++-19` if it runs.
fn configured() -> Result<PathBuf, String> {
    let clang = std::env::var_os("TESSERA_CLANG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("clang++-19"));
    match Command::new(&clang).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(clang),
        Ok(o) => Err(format!(
            "`{} --version` failed: {}",
            clang.display(),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Err(format!(
            "cannot run `{}` ({e}); set TESSERA_CLANG to clang++ 19",
            clang.display()
        )),
    }
}

/// What clang's resource-usage remarks say of one kernel.
#[derive(Clone, Debug, Default, PartialEq)]
struct Remark {
    name: String,
    vgprs: u32,
    agprs: u32,
    sgprs: u32,
    lds: u32,
    occupancy: u32,
    vgpr_spill: u32,
}

/// The remarks of every kernel of a compilation's stderr, in order.
fn parse_remarks(stderr: &str) -> Vec<Remark> {
    let mut out: Vec<Remark> = Vec::new();
    for line in stderr.lines() {
        let Some((_, rest)) = line.split_once("remark: ") else {
            continue;
        };
        let rest = rest
            .trim()
            .trim_end_matches("[-Rpass-analysis=kernel-resource-usage]")
            .trim();
        let Some((key, value)) = rest.rsplit_once(": ") else {
            continue;
        };
        if key == "Function Name" {
            out.push(Remark {
                name: value.to_string(),
                ..Remark::default()
            });
            continue;
        }
        let (Some(last), Ok(v)) = (out.last_mut(), value.parse::<u32>()) else {
            continue;
        };
        match key {
            "VGPRs" => last.vgprs = v,
            "AGPRs" => last.agprs = v,
            "SGPRs" => last.sgprs = v,
            "LDS Size [bytes/block]" => last.lds = v,
            "Occupancy [waves/SIMD]" => last.occupancy = v,
            "VGPRs Spill" => last.vgpr_spill = v,
            _ => {}
        }
    }
    out
}

/// Compiles HIP `source` for `arch` and returns clang's remarks, or its
/// error output.
fn compile(clang: &PathBuf, source: &str, arch: Arch, tag: &str) -> Result<Vec<Remark>, String> {
    // `TESSERA_CLANG_CACHE=dir` keeps clang's output per source, so that
    // studying the estimate does not recompile what has not changed.
    let cached = std::env::var_os("TESSERA_CLANG_CACHE").map(|d| {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (source, arch.name()).hash(&mut h);
        PathBuf::from(d).join(format!("{:016x}.txt", h.finish()))
    });
    if let Some(text) = cached
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
    {
        return match text.split_once('\n') {
            Some(("ok", stderr)) => Ok(parse_remarks(stderr)),
            Some((_, stderr)) => Err(stderr.to_string()),
            None => Err(text),
        };
    }
    let result = run_clang(clang, source, arch, tag);
    if let Some(p) = cached {
        let _ = std::fs::create_dir_all(p.parent().expect("a cache dir"));
        let text = match &result {
            Ok(stderr) => format!("ok\n{stderr}"),
            Err(stderr) => format!("error\n{stderr}"),
        };
        let _ = std::fs::write(p, text);
    }
    result.map(|stderr| parse_remarks(&stderr))
}

/// Runs clang on `source` for `arch`: its stderr, as `Err` where it fails.
fn run_clang(clang: &PathBuf, source: &str, arch: Arch, tag: &str) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("tessera-clang-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join(format!("{tag}-{}.hip", arch.name()));
    let obj = dir.join(format!("{tag}-{}.o", arch.name()));
    std::fs::write(&src, source).map_err(|e| e.to_string())?;
    let out = Command::new(clang)
        .args(["-x", "hip"])
        .arg(format!("--offload-arch={}", arch.name()))
        .args([
            "--cuda-device-only",
            "--no-gpu-bundle-output",
            "-nogpulib",
            "-nogpuinc",
            "-O3",
            "-Rpass-analysis=kernel-resource-usage",
            "-c",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .output()
        .map_err(|e| e.to_string())?;
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&obj);
    if !out.status.success() {
        return Err(stderr);
    }
    Ok(stderr)
}

/// One probe: a workgroup size and the registers and LDS it claims.
struct Probe {
    threads: u32,
    vgpr: Option<u32>,
    agpr: Option<u32>,
    sgpr: Option<u32>,
    lds: u32,
}

impl Probe {
    fn kernel(&self, i: usize) -> String {
        let mut clobbers = Vec::new();
        clobbers.extend(self.vgpr.map(|v| format!("\"v{v}\"")));
        clobbers.extend(self.agpr.map(|a| format!("\"a{a}\"")));
        clobbers.extend(self.sgpr.map(|s| format!("\"s{s}\"")));
        let asm = if clobbers.is_empty() {
            String::new()
        } else {
            format!("asm volatile(\"\" ::: {});", clobbers.join(", "))
        };
        let lds = if self.lds == 0 {
            String::new()
        } else {
            format!(
                "static __attribute__((shared)) float buf[{}];\n  buf[(int)p[1]] = 2.0f;\n  __builtin_amdgcn_s_barrier();\n  p[2] = buf[(int)p[3]];",
                self.lds / 4
            )
        };
        format!(
            "extern \"C\" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(1, {}))) void probe{i}(float* p) {{\n  {asm}\n  {lds}\n  p[0] = 1.0f;\n}}\n",
            self.threads
        )
    }
}

/// The probes of one arch: VGPRs across the granules, AGPRs beside VGPRs on
/// CDNA, SGPRs across gfx9's steps, LDS and workgroup sizes across the
/// workgroup limits.
fn probes_of(arch: Arch) -> Vec<Probe> {
    let cdna = arch != Arch::Gfx1100;
    let plain = |threads| Probe {
        threads,
        vgpr: None,
        agpr: None,
        sgpr: None,
        lds: 0,
    };
    let mut out = Vec::new();
    for v in [
        23, 31, 47, 63, 64, 71, 95, 100, 119, 127, 143, 167, 191, 255,
    ] {
        out.push(Probe {
            vgpr: Some(v),
            ..plain(256)
        });
    }
    if cdna {
        for (v, a) in [
            (1, 63),
            (31, 31),
            (61, 63),
            (64, 63),
            (127, 127),
            (255, 255),
        ] {
            out.push(Probe {
                vgpr: Some(v),
                agpr: Some(a),
                ..plain(256)
            });
        }
    }
    for s in [60, 80, 90, 95, 96, 101] {
        out.push(Probe {
            sgpr: Some(s),
            ..plain(256)
        });
    }
    for threads in [64, 128, 256, 512, 1024] {
        for lds in [4096, 8192, 16384, 20480, 32768, 65536] {
            out.push(Probe {
                lds,
                ..plain(threads)
            });
        }
    }
    for threads in [96, 192, 320, 544, 576, 640, 704, 960] {
        out.push(plain(threads));
    }
    out
}

/// The occupancy from clang's own register and LDS counts equals clang's.
fn probes(clang: &PathBuf, failures: &mut Vec<String>) {
    for arch in ARCHS {
        let probes = probes_of(arch);
        let source: String = probes
            .iter()
            .enumerate()
            .map(|(i, p)| p.kernel(i))
            .collect();
        let remarks = match compile(clang, &source, arch, "probes") {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{arch}: probes do not compile: {e}"));
                continue;
            }
        };
        if remarks.len() != probes.len() {
            failures.push(format!(
                "{arch}: {} remarks for {} probes",
                remarks.len(),
                probes.len()
            ));
            continue;
        }
        let mut agree = 0;
        for (p, r) in probes.iter().zip(&remarks) {
            let occ = amd_occupancy(
                arch,
                AmdUsage {
                    threads: p.threads,
                    vgprs: r.vgprs,
                    agprs: r.agprs,
                    sgprs: r.sgprs,
                    lds_bytes: r.lds,
                },
            );
            if occ.waves_per_simd == Some(r.occupancy) {
                agree += 1;
            } else {
                failures.push(format!(
                    "{arch}: {} ({} threads, {} VGPRs, {} AGPRs, {} SGPRs, {} B LDS): clang {} waves/SIMD, the model {:?}",
                    r.name, p.threads, r.vgprs, r.agprs, r.sgprs, r.lds, r.occupancy, occ.waves_per_simd
                ));
            }
        }
        println!(
            "ok   {arch} occupancy from clang's counts: {agree} of {} probes agree",
            probes.len()
        );
    }
}

/// The `.tsr` files measured: stdlib/, examples/ (not examples/errors/) and
/// every `.tsr` under tests/ (those that do not check clean, such as session
/// scripts and error cases, are left out where they are loaded), sorted.
fn corpus_files() -> Vec<PathBuf> {
    tsr_files(&[("stdlib", true), ("examples", false), ("tests", true)])
}

/// One kernel measured: the estimate beside clang's remark.
struct Row {
    label: String,
    arch: Arch,
    estimate: resources::Resources,
    clang: Remark,
}

impl Row {
    /// The relative error of the VGPR estimate. Where clang spilled VGPRs it
    /// reports its limit, not the kernel's demand; an estimate above the
    /// limit predicted that (W0003), so the comparison is at the limit.
    fn error(&self) -> f64 {
        let clang = self.clang.vgprs;
        let estimate = if self.clang.vgpr_spill > 0 {
            self.estimate.regs.min(clang)
        } else {
            self.estimate.regs
        };
        (estimate as f64 - clang as f64) / clang.max(1) as f64
    }

    /// Whether the estimate allocates as many VGPRs as clang's count.
    fn vgprs_agree(&self) -> bool {
        let amd = self.arch.info().amd.expect("an AMD row");
        let g = amd.vgpr_granule;
        let alloc = |v: u32| v.max(1).div_ceil(g);
        let est_agprs = self.estimate.amd.map_or(0, |a| a.agprs);
        alloc(occupancy_vgprs(self.estimate.regs, est_agprs))
            == alloc(occupancy_vgprs(self.clang.vgprs, self.clang.agprs))
    }
}

/// The VGPRs of the unified file a wave takes (LLVM's `getTotalNumVGPRs`).
fn occupancy_vgprs(vgprs: u32, agprs: u32) -> u32 {
    tessera::backend::occupancy::amd_total_vgprs(vgprs, agprs)
}

/// The goal for the VGPR estimate's median error.
const MEDIAN_BOUND: f64 = 0.15;
/// The goal for its worst error.
const WORST_BOUND: f64 = 0.35;

/// Where the estimate stands against the goals, per arch, as last measured
/// with clang-19 and the HIP printer of this writing: the median error and
/// the number of kernels over [`WORST_BOUND`]. The medians are within the
/// goal; the worst errors are not (see the module docs of
/// `backend/resources/amd.rs` for what the model misses); the test holds
/// the estimate to these so that it does not get worse, and prints how far
/// it is from the goals. Measured again when the estimate began to model
/// LLVM's common-subexpression and dead-code elimination, scalar loads, the
/// vector ALU's floats, and what InstCombine folds into and sinks into the
/// branches of masked accesses (before: 17.5% / 16.8% / 19.3%, 46 / 46 /
/// 44). The outlier counts rose with the corpus when the codegen filetests
/// of bf16 rounding, P from registers and index masks added five kernels,
/// 3 / 2 / 5 of them more than 35% off; and on gfx1100 with a sixth, a bf16
/// rounding stored as f32 (9 VGPRs estimated, clang 16), when gfx942 came
/// down by one. Held again (medians 13.2% / 12.5% to 14.3% / 14.3%, gfx1100
/// 34 to 36 outliers) when lowering began to fold constant shifts and
/// XORs, drop dead code and fuse `x + dot` into the dot's accumulator: the
/// code is smaller, clang's counts barely moved, and the estimate, which
/// mostly undercounts on AMD, went further under (gfx1100's new outliers
/// are two attention kernels, whose accumulating WMMAs clang gives 181 and
/// 256 VGPRs against 107 and 145 estimated). Held again (gfx90a's median
/// 14.4% to 14.5%; 25 / 26 / 36 to 26 / 27 / 40 outliers) when a tile stopped
/// counting as a splat for equal registers alone: the HIP of
/// tests/numerics/attention.tsr's kernels changed, one more of them is past
/// 35% on each arch (causal_attn[D=64] on CDNA: 61 VGPRs estimated, clang
/// 94; window_attn[D=128] on gfx1100: 81, clang 125), and
/// tests/gpu/row_tiles.tsr added 14 row-softmax kernels, three of them over
/// 35% on gfx1100 (68 estimated, clang 49 or 107). Held again (gfx90a 26 to
/// 30 outliers) when std.linalg's GEMMs went from 8 to 4 warps: LLVM then
/// keeps their 64 accumulators a lane in AGPRs (67 VGPRs and 64 AGPRs), which
/// the estimate now models (`agpr_accumulators`), and the rest of the kernel,
/// 43 VGPRs estimated, is under clang's 67 on gfx90a (64 on gfx942, within
/// 35%); two more kernels with MFMA accumulators fell under by the same
/// rule (w8a16_gemm, window_attn[D=128]) and two came within 35%
/// (batched_gemm, gemm_tuned on gfx942). Held again (gfx1100 40 to 44
/// outliers) when tests/gpu/user_gemm.tsr and
/// tests/codegen/mma/wgmma_loaded_acc.tsr added GEMMs at 128 x 128 x 64 over
/// 8 waves and a batched one at 64 x 64 x 32: clang gives them 230-245 VGPRs
/// (116 the batched one) against 139-141 (75) estimated, as it does
/// fresh.tsr's GEMMs; hoisting every k step's LDS loads ahead of the WMMAs
/// in the model brought those within 35% but put the BK = 32 GEMMs 39-43%
/// over, so the model stays. Tightened (30 / 27 / 44 to 28 / 25 / 43
/// outliers, medians 14.4% / 12.6% to 13.8% / 11.6% on gfx942 / gfx1100) when
/// a broadcast tile an op needs in another layout began to be broadcast
/// again from its source (a GEMM epilogue's bias row, not its 128 x 128
/// copies, through LDS). gfx1100 back to 44 when tests/gpu/user_gemm.tsr
/// added a persistent GEMM at 128 x 128 x 64 over 8 waves: 139 VGPRs
/// estimated, clang 229, as for the other GEMMs of that tile above.
/// gfx1100 to 45 when tests/codegen/mma/wgmma_attention_two_warpgroups.tsr
/// added an attention over 8 waves: 134 VGPRs estimated, clang 241, as for
/// tests/gpu/user_attention.tsr's attentions on gfx1100 (clang keeps the
/// WMMA accumulators of both products live across the loop). gfx1100 to 46
/// when tests/codegen/pipeline/loop_extent_unpredicated.tsr added `keys`, a
/// 64 x 64 dot accumulated over a loop on 4 waves: 105 VGPRs estimated,
/// clang 175, the same undercount of WMMA accumulators across a loop.
/// Held again (28 / 25 / 46 to 31 / 28 / 47 outliers, gfx1100's median
/// 11.6% to 12.0%) when five bf16-output GEMMs came into the corpus
/// (std.linalg's `gemm_bf16_out`, tests/codegen/mma/wgmma_tma_store.tsr and
/// two in tests/gpu/user_gemm.tsr; their sm_90a stores go by TMA, which no
/// AMD target has, so no kernel already here changed): the 64 x 128 x 64
/// ones over 4 waves are 59-60 VGPRs estimated on CDNA against clang's
/// 93-98, the 128 x 128 one over 8 waves 139 on gfx1100 against 226, the
/// accumulator undercount of the GEMMs above. CDNA to 32 / 29 when
/// tests/codegen/mma/staged_store_read_back.tsr added a sixth such GEMM
/// (64 x 128 x 64, 4 waves: 59 VGPRs estimated, clang 93-98). CDNA to 34 /
/// 31 when tests/codegen/pipeline/tma_across_tiles.tsr added two more
/// persistent GEMMs of that tile (59-60 estimated, clang 95-96; their sm_90a
/// pipeline across tiles has no AMD counterpart, so no AMD kernel changed).
/// Medians 14.5% / 13.9% / 12.0% to 14.8% / 14.0% / 12.5% when
/// tests/codegen/pipeline/pipelined_offset_index.tsr and
/// tests/gpu/user_attention.tsr's `lagged_attn` added four attention
/// kernels, all within 35% but above the median (-13% to -33%: the WMMA and
/// MFMA accumulators of attention's two products, as above). One more
/// outlier on each arch, and gfx942's median 14.0% to 14.3%, when
/// tests/codegen/control/if_splat_branch_layout.tsr added a one-tile
/// 64 x 64 dot behind an `if` (41 VGPRs estimated on CDNA, clang 27-29; 73
/// on gfx1100, clang 163); no other kernel's estimate or count moved.
/// Tightened (35 / 32 / 48 to 22 / 22 / 26 outliers, medians 14.6% / 14.3%
/// / 12.5% to 11.1% / 10.0% / 9.4%) when the estimate began to spend the
/// VGPRs the occupancy leaves free as LLVM's scheduler does (the MMA
/// fragments of as many k steps as fit ahead of the MMAs, a third of the
/// way to a latency order), to count the VGPR copy of MFMA accumulators
/// across a loop's head, and to put stored values in VGPRs: the WMMA GEMMs
/// and attentions on gfx1100, the 64 x 128 x 64 GEMMs on CDNA and small
/// kernels of independent chains came within 35% (51 kernels); 6 went past
/// it: `keys` on CDNA (57 estimated, clang 33-34: a copy clang does not
/// make where one operand is loop-invariant), std.linalg's `gemm_tf32` on
/// gfx942 (57, clang 42: more fragments ahead than clang holds), and on
/// gfx1100 an f64 dot (60, clang 43), a dot of f8 operands in software
/// (105, clang 61) and `small_ints` (21, clang 15), latency orders clang
/// does not take. Tightened (22 / 22 / 26 to 21 / 21 / 26 outliers,
/// gfx1100's median 9.4% to 9.1%) when `exp2` began to print as
/// `__builtin_exp2f` (subnormal results kept, as on the CPU and NVIDIA):
/// tests/ui/valid/powers.tsr's clang count went 46 to 41 on CDNA (29
/// estimated); the GEMMs whose warps hold two 16-row tiles (tests/gpu,
/// tests/codegen/mma) came within 35%. Tightened (21 / 21 / 26 to 20 / 20 /
/// 25, gfx942's median 10.0% to 9.8%) when a uniform load of fewer than
/// four bytes began to count as a vector load (scalar loads move dwords):
/// tests/fuzz's `report_odd_tile_slow` (a 1,023-element i8 tile every lane
/// holds) went from 2 VGPRs estimated to past the register file, where
/// clang spills (256 and 1,724 spilled); no other kernel moved. gfx942's
/// median at 10.0% (9.8%) since the corpus gained the two kernels of
/// tests/codegen/memory/two_pass_streaming.tsr (25 VGPRs estimated, clang
/// 36; 9, clang 10), both above the median of the 253 before (gfx90a's
/// and gfx1100's medians and every arch's outliers stayed where they were).
/// gfx90a's median a hair higher (still 11.2%) since the corpus gained the
/// f64 transcendental kernels of tests/gpu/f64_math.tsr and
/// tests/codegen/math/f64_from_fmas.tsr (9 an arch, 3% to 29% off, none over
/// 35%; the outliers stayed where they were).
fn held(arch: Arch) -> (f64, usize) {
    match arch {
        Arch::Gfx90a => (0.1125, 20),
        Arch::Gfx942 => (0.1005, 20),
        _ => (0.0915, 25),
    }
}

fn corpus(clang: &PathBuf, failures: &mut Vec<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = corpus_files();
    let table = std::env::var_os("TESSERA_CLANG_TABLE").is_some();
    for arch in ARCHS {
        let mut rows: Vec<Row> = Vec::new();
        let mut skipped = Vec::new();
        let mut refusals = 0;
        for path in &files {
            let shown = path
                .strip_prefix(&root)
                .unwrap_or(path)
                .display()
                .to_string();
            let Ok(text) = std::fs::read_to_string(path) else {
                failures.push(format!("{shown}: cannot read"));
                continue;
            };
            if !text.contains("@kernel") {
                continue;
            }
            let mut db = Database::new();
            db.set_arch(arch);
            let file = db.set_source(&shown, text);
            if db.diagnostics(file).iter().any(|d| d.is_error()) {
                skipped.push(format!("{shown}: check errors"));
                continue;
            }
            // The kernels of the file by specialization tag: one HIP module each.
            let mut modules: Vec<(String, Vec<(String, tessera::ir::target::Kernel)>)> = Vec::new();
            for (name, item, _) in file_kernels(&db, file) {
                for (tag, spec) in specializations(&db, item) {
                    let label = format!("{shown}:{name}{tag}");
                    let tk = match tile_ir(&db, item, db.options(), spec) {
                        Ok(k) => k.clone(),
                        Err(d) => {
                            let codes: Vec<&str> = d.iter().map(|d| d.code).collect();
                            skipped.push(format!("{label}: Tile IR {codes:?}"));
                            continue;
                        }
                    };
                    match tessera::ir::target::lower(&tk, arch) {
                        Ok(t) => match modules.iter_mut().find(|m| m.0 == tag) {
                            Some(m) => m.1.push((label, t)),
                            None => modules.push((tag, vec![(label, t)])),
                        },
                        Err(e) => skipped.push(format!("{label}: Target IR: {}", e.message)),
                    }
                }
            }
            for (tag, mut kernels) in modules {
                // A kernel the estimate says cannot run (more LDS than a
                // workgroup may use) must be one clang refuses too: each
                // goes through clang alone.
                let (refused, runs): (Vec<_>, Vec<_>) = kernels
                    .drain(..)
                    .partition(|k| resources::of_target(&k.1).occupancy.cannot_launch());
                kernels = runs;
                for (label, target) in refused {
                    let hip = match hip_module(arch, std::slice::from_ref(&target)) {
                        Ok(h) => h,
                        Err(e) => {
                            failures.push(format!("{label} ({arch}): HIP printer: {e}"));
                            continue;
                        }
                    };
                    match compile(clang, &hip, arch, &format!("refused{}", rows.len())) {
                        Err(e) if e.contains("exceeds limit") => {
                            refusals += 1;
                            println!(
                                "ok   {label} ({arch}): cannot run, and clang refuses it: {}",
                                e.lines()
                                    .find(|l| l.contains("exceeds limit"))
                                    .unwrap_or("")
                                    .trim()
                            );
                        }
                        other => failures.push(format!(
                            "{label} ({arch}): the estimate says it cannot run, clang: {other:?}"
                        )),
                    }
                }
                if kernels.is_empty() {
                    continue;
                }
                let targets: Vec<tessera::ir::target::Kernel> =
                    kernels.iter().map(|k| k.1.clone()).collect();
                let hip = match hip_module(arch, &targets) {
                    Ok(h) => h,
                    Err(e) => {
                        failures.push(format!("{shown}{tag} ({arch}): HIP printer: {e}"));
                        continue;
                    }
                };
                let file_tag = format!("corpus{}", rows.len());
                let remarks = match compile(clang, &hip, arch, &file_tag) {
                    Ok(r) => r,
                    Err(e) => {
                        failures.push(format!("{shown}{tag} ({arch}): clang rejects the HIP: {e}"));
                        continue;
                    }
                };
                for (label, target) in kernels {
                    match remarks.iter().find(|r| r.name == target.name) {
                        Some(r) => rows.push(Row {
                            label,
                            arch,
                            estimate: resources::of_target(&target),
                            clang: r.clone(),
                        }),
                        None => failures.push(format!("{label} ({arch}): no clang remark")),
                    }
                }
            }
        }
        println!("{arch}: {refusals} kernels cannot run (LDS), as clang says");
        summarise(arch, &rows, &skipped, table, failures);
    }
}

/// The table of one arch's rows and its summary, and the goals' failures.
fn summarise(
    arch: Arch,
    rows: &[Row],
    skipped: &[String],
    table: bool,
    failures: &mut Vec<String>,
) {
    if table {
        println!(
            "{:<60} {:>5} {:>5} {:>7} {:>5} {:>5} {:>6} {:>6}",
            format!("kernel ({arch})"),
            "VGPR",
            "clang",
            "error",
            "SGPR",
            "clang",
            "waves",
            "clang"
        );
        for r in rows {
            println!(
                "{:<60} {:>5} {:>5} {:>+6.1}% {:>5} {:>5} {:>6} {:>6}",
                r.label,
                r.estimate.regs,
                r.clang.vgprs,
                100.0 * r.error(),
                r.estimate.amd.map_or(0, |a| a.sgprs),
                r.clang.sgprs,
                r.estimate.occupancy.waves_per_simd.unwrap_or(0),
                r.clang.occupancy
            );
        }
    }
    for s in skipped {
        println!("skip {arch} {s}");
    }
    if rows.is_empty() {
        failures.push(format!("{arch}: no kernel measured"));
        return;
    }
    let mut errors: Vec<f64> = rows.iter().map(|r| r.error().abs()).collect();
    errors.sort_by(f64::total_cmp);
    let median = errors[errors.len() / 2];
    let p90 = errors[(errors.len() * 9 / 10).min(errors.len() - 1)];
    let worst_row = rows
        .iter()
        .max_by(|a, b| a.error().abs().total_cmp(&b.error().abs()))
        .expect("rows");
    let over: Vec<&Row> = rows
        .iter()
        .filter(|r| r.error().abs() > WORST_BOUND)
        .collect();
    let agreeing: Vec<&Row> = rows.iter().filter(|r| r.vgprs_agree()).collect();
    let occupancy_equal = agreeing
        .iter()
        .filter(|r| r.estimate.occupancy.waves_per_simd == Some(r.clang.occupancy))
        .count();
    let sgpr_errors = {
        let mut e: Vec<f64> = rows
            .iter()
            .map(|r| {
                let est = r.estimate.amd.map_or(0, |a| a.sgprs) as f64;
                ((est - r.clang.sgprs as f64) / r.clang.sgprs.max(1) as f64).abs()
            })
            .collect();
        e.sort_by(f64::total_cmp);
        e[e.len() / 2]
    };
    println!(
        "{arch}: {} kernels, VGPR error median {:.1}%, 90th percentile {:.1}%, worst {:+.1}% ({}: {} estimated, clang {}), {} over {:.0}%; VGPR allocation agrees on {}, occupancy equal on {} of them; SGPR median error {:.1}%",
        rows.len(),
        100.0 * median,
        100.0 * p90,
        100.0 * worst_row.error(),
        worst_row.label,
        worst_row.estimate.regs,
        worst_row.clang.vgprs,
        over.len(),
        100.0 * WORST_BOUND,
        agreeing.len(),
        occupancy_equal,
        100.0 * sgpr_errors
    );
    let (held_median, held_over) = held(arch);
    if median > MEDIAN_BOUND || !over.is_empty() {
        println!(
            "goal not met on {arch}: median {:.1}% (goal {:.0}%), {} kernels over {:.0}% (goal none); held at {:.1}% and {held_over}",
            100.0 * median,
            100.0 * MEDIAN_BOUND,
            over.len(),
            100.0 * WORST_BOUND,
            100.0 * held_median
        );
        for r in &over {
            println!(
                "over {} ({arch}): {} VGPRs estimated, clang {} ({:+.1}%)",
                r.label,
                r.estimate.regs,
                r.clang.vgprs,
                100.0 * r.error()
            );
        }
    }
    if median > held_median + 1e-9 {
        failures.push(format!(
            "{arch}: VGPR median error {:.1}%, worse than the {:.1}% held",
            100.0 * median,
            100.0 * held_median
        ));
    }
    if over.len() > held_over {
        failures.push(format!(
            "{arch}: {} kernels over {:.0}%, more than the {held_over} held",
            over.len(),
            100.0 * WORST_BOUND
        ));
    }
    for r in agreeing {
        if r.estimate.occupancy.waves_per_simd != Some(r.clang.occupancy) {
            failures.push(format!(
                "{} ({arch}): VGPRs agree ({} estimated, clang {}) but {:?} waves/SIMD estimated, clang {} (LDS {} estimated, clang {}; SGPRs {}, clang {})",
                r.label,
                r.estimate.regs,
                r.clang.vgprs,
                r.estimate.occupancy.waves_per_simd,
                r.clang.occupancy,
                r.estimate.smem_bytes,
                r.clang.lds,
                r.estimate.amd.map_or(0, |a| a.sgprs),
                r.clang.sgprs
            ));
        }
    }
    for r in rows {
        if r.estimate.smem_bytes != r.clang.lds {
            failures.push(format!(
                "{} ({arch}): {} B of LDS estimated, clang {}",
                r.label, r.estimate.smem_bytes, r.clang.lds
            ));
        }
    }
}

/// The HIP module of `kernels` (the HIP printer's).
fn hip_module(arch: Arch, kernels: &[tessera::ir::target::Kernel]) -> Result<String, String> {
    tessera::backend::hip::module(arch, kernels).map_err(|e| e.to_string())
}
