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
//!   must be clang's, on every probe.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use tessera::backend::occupancy::{amd_occupancy, AmdUsage};
use tessera::target::Arch;

const ARCHS: [Arch; 3] = [Arch::Gfx90a, Arch::Gfx942, Arch::Gfx1100];

fn main() -> ExitCode {
    let clang = match configured() {
        Ok(c) => c,
        Err(e) if std::env::var_os("CI").is_none() => {
            println!("SKIPPED clang AMDGPU validation: {e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            println!("FAIL clang AMDGPU validation: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut failures = Vec::new();
    probes(&clang, &mut failures);
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            println!("FAIL {f}");
        }
        ExitCode::FAILURE
    }
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
    Ok(parse_remarks(&stderr))
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
