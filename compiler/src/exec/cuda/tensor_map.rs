//! TMA tensor maps, encoded at each launch from the tensor arguments
//! (`cuTensorMapEncodeTiled`) and passed by value (Target IR's
//! `Kernel::tensor_maps`, after the dims).

use cudarc::driver::sys::{
    self, CUresult, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill,
    CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::DeviceRepr;

use crate::check::DType;
use crate::ir::target::TensorMap;

/// An encoded tensor map: the driver's opaque 128 bytes, 64-byte aligned.
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub(super) struct Encoded(CUtensorMap);

// SAFETY: `CUtensorMap` is plain bytes (`[u64; 16]`, `repr(C)`), which the
// launch copies into the kernel's `.param .align 64 .b8 [128]` parameter as
// is; it holds no host pointer.
unsafe impl DeviceRepr for Encoded {}

/// What `cuTensorMapEncodeTiled` is given for one map, all innermost first.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Tiled {
    pub(super) data_type: CUtensorMapDataType,
    pub(super) dims: Vec<u64>,
    /// Byte strides of every dim but the innermost.
    pub(super) strides: Vec<u64>,
    pub(super) box_dims: Vec<u32>,
    pub(super) swizzle: CUtensorMapSwizzle,
    /// The tensor has no elements: every dim is encoded as 1 and its first
    /// 16 bytes must read as zeros (the allocation holds at least 512), so
    /// the loads see what masked ones would: zeros.
    pub(super) empty: bool,
}

/// The encode call's arguments for `map` over a row-major tensor of
/// `shape` and `dtype`, or why it cannot be encoded.
pub(super) fn tiled(map: &TensorMap, shape: &[usize], dtype: DType) -> Result<Tiled, String> {
    use CUtensorMapDataType::*;
    let rank = shape.len();
    if map.box_dims.len() != rank || !(1..=5).contains(&rank) {
        return Err(format!(
            "a rank-{rank} tensor for a tensor map of {} dims",
            map.box_dims.len()
        ));
    }
    let data_type = match dtype {
        DType::BF16 => CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F32 => CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        DType::I32 => CU_TENSOR_MAP_DATA_TYPE_INT32,
        DType::U8 | DType::I8 | DType::F8E4M3 | DType::F8E5M2 => CU_TENSOR_MAP_DATA_TYPE_UINT8,
        d => return Err(format!("no tensor map for {} elements", d.name())),
    };
    let swizzle = match map.swizzle {
        0 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        32 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        64 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        128 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        s => return Err(format!("no {s}-byte TMA swizzle")),
    };
    let elem = dtype.bytes();
    let empty = shape.contains(&0);
    let dims: Vec<u64> = match empty {
        true => vec![1; rank],
        false => shape.iter().rev().map(|&d| d as u64).collect(),
    };
    let mut strides = Vec::with_capacity(rank - 1);
    let mut stride = elem;
    for &d in &dims[..rank - 1] {
        stride = stride.checked_mul(d).ok_or("a stride past 64 bits")?;
        // TMA's strides: multiples of 16 bytes below 2^40 (the empty
        // tensor's are padded to 16).
        let s = if empty { 16 } else { stride };
        if !s.is_multiple_of(16) || s >= 1 << 40 {
            return Err(format!("a {s}-byte stride (TMA needs multiples of 16)"));
        }
        strides.push(s);
    }
    if dims.iter().any(|&d| d > 1 << 32) {
        return Err("a dim past 2^32".into());
    }
    Ok(Tiled {
        data_type,
        dims,
        strides,
        box_dims: map.box_dims.clone(),
        swizzle,
        empty,
    })
}

/// Encodes `t` over the device address `addr` (16-byte aligned: the
/// executor's blocks are 512-byte multiples from `cuMemAlloc`).
pub(super) fn encode(t: &Tiled, addr: u64) -> Result<Encoded, CUresult> {
    let mut map = CUtensorMap { opaque: [0; 16] };
    let elem_strides = vec![1u32; t.dims.len()];
    // SAFETY: every pointer is to a live local of the length the rank
    // (`dims.len()`, 1 to 5) says: `dims`, `elem_strides` and `box_dims`
    // rank entries, `strides` rank - 1 (`tiled` builds them so); `map` is
    // 128 writable, 64-byte aligned bytes. The driver only reads `addr`'s
    // value; the tensor it names outlives the launch that uses the map.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            t.data_type,
            t.dims.len() as u32,
            addr as *mut std::ffi::c_void,
            t.dims.as_ptr(),
            t.strides.as_ptr(),
            t.box_dims.as_ptr(),
            elem_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            t.swizzle,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    match r {
        CUresult::CUDA_SUCCESS => Ok(Encoded(map)),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(box_dims: &[u32], swizzle: u32) -> TensorMap {
        TensorMap {
            tensor: 0,
            name: "A".into(),
            box_dims: box_dims.to_vec(),
            swizzle,
        }
    }

    #[test]
    fn dims_and_strides_are_innermost_first_in_bytes() {
        let t = tiled(&map(&[64, 128], 128), &[4096, 1024], DType::BF16).unwrap();
        assert_eq!(t.dims, vec![1024, 4096]);
        assert_eq!(t.strides, vec![2048]);
        assert_eq!(
            t.data_type,
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        );
        assert_eq!(t.swizzle, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B);
        assert!(!t.empty);
        let t = tiled(&map(&[32, 64, 1], 64), &[3, 100, 40], DType::F16).unwrap();
        assert_eq!(t.dims, vec![40, 100, 3]);
        assert_eq!(t.strides, vec![80, 8000]);
    }

    #[test]
    fn strides_tma_cannot_take_are_refused() {
        // 1001 bf16 a row: 2002 bytes, not a multiple of 16.
        let e = tiled(&map(&[64, 128], 128), &[64, 1001], DType::BF16).unwrap_err();
        assert!(e.contains("2002-byte stride"), "{e}");
        assert!(tiled(&map(&[64, 128], 128), &[8, 8, 8], DType::BF16).is_err());
        assert!(tiled(&map(&[64, 128], 48), &[64, 64], DType::BF16).is_err());
    }

    #[test]
    fn an_empty_tensor_is_one_element_of_zeros() {
        let t = tiled(&map(&[64, 128], 128), &[0, 1001], DType::BF16).unwrap();
        assert!(t.empty);
        assert_eq!(t.dims, vec![1, 1]);
        assert_eq!(t.strides, vec![16]);
    }
}
