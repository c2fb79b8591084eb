//! Tests of the CUDA executor that run on every machine: without a driver or
//! a GPU, opening one is E0721 (no panic); with one, `vadd` runs there and
//! agrees with the CPU executor.

use super::*;

#[test]
fn opening_a_gpu_is_a_diagnostic_or_a_gpu() {
    match Gpu::open(0) {
        Ok(gpu) => {
            let info = gpu.info();
            assert!(info.memory_bytes > 0 && !info.name.is_empty(), "{info:?}");
            assert!(info.arch.is_nvidia());
        }
        Err(e) => {
            assert_eq!(e.code, "E0721", "{e}");
            assert!(e.help.is_some());
        }
    }
    // An ordinal past every GPU is E0721 in any case.
    let e = Gpu::open(1 << 20).err().expect("no machine has 2^20 GPUs");
    assert_eq!(e.code, "E0721", "{e}");
}
