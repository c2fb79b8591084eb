//! Tests of run-time tensors: storage and device copies, indexing,
//! broadcasting, conversions and printing.

use super::*;

/// A "GPU" buffer in host memory, to test the mirror without a GPU.
struct FakeBuffer {
    bytes: Mutex<Vec<u8>>,
    owner: u64,
}

impl DeviceBuffer for FakeBuffer {
    fn read(&self, host: &mut [u8]) -> Result<(), ExecError> {
        host.copy_from_slice(&self.bytes.lock().unwrap());
        Ok(())
    }
    fn write(&self, host: &[u8]) -> Result<(), ExecError> {
        self.bytes.lock().unwrap().copy_from_slice(host);
        Ok(())
    }
    fn zero(&self) -> Result<(), ExecError> {
        self.bytes.lock().unwrap().fill(0);
        Ok(())
    }
    fn copy_from_device(&self, _: &dyn DeviceBuffer) -> Result<(), ExecError> {
        Err(ExecError::new("E0730", "not between fake buffers"))
    }
    fn address(&self) -> u64 {
        self.bytes.lock().unwrap().as_ptr() as u64
    }
    fn settle(&self) -> Result<(), ExecError> {
        Ok(())
    }
    fn owner(&self) -> u64 {
        self.owner
    }
}

fn fake(bytes: Vec<u8>) -> Box<dyn DeviceBuffer> {
    Box::new(FakeBuffer {
        bytes: Mutex::new(bytes),
        owner: 7,
    })
}

fn host_len(t: &Tensor) -> usize {
    // SAFETY: a test's tensor, not shared with a launch.
    unsafe { &*t.storage.host.get() }.len()
}

#[test]
fn device_results_make_their_host_copy_when_read() {
    let elems = [1.5f32, -2.0, 3.25];
    let bytes: Vec<u8> = elems.iter().flat_map(|x| x.to_le_bytes()).collect();
    let t = Tensor::written_on_device(&[3], DType::F32, fake(bytes)).unwrap();
    assert_eq!(host_len(&t), 0, "no host memory before a read");
    // Its device address needs no host copy either.
    let addr = t
        .storage
        .device_address(7, |_| unreachable!("it has one"))
        .unwrap();
    assert_ne!(addr, 0);
    assert_eq!(host_len(&t), 0);
    assert_eq!(t.to_f64_vec(), vec![1.5, -2.0, 3.25]);
    assert_eq!(host_len(&t), 3);

    // Zeros on both sides read as zeros, and a lost device copy leaves
    // the host's zeros.
    let z = Tensor::zeros_on_device(&[2, 2], DType::BF16, |n| Ok(fake(vec![9; n]))).unwrap();
    assert_eq!(host_len(&z), 0);
    assert_eq!(z.to_f64_vec(), vec![0.0; 4]);
    let lost = Tensor::written_on_device(&[2], DType::I32, fake(vec![1; 8])).unwrap();
    assert!(lost.forget_device(7));
    assert_eq!(lost.to_f64_vec(), vec![0.0; 2]);
    // A host write after a deferred one reaches the host's own copy.
    let w = Tensor::written_on_device(&[2], DType::F32, fake(vec![0; 8])).unwrap();
    w.assign(
        &Tensor::from_f64(&[2], DType::F32, &[4.0, 5.0]),
        &Interrupt::new(),
    )
    .unwrap();
    assert_eq!(w.to_f64_vec(), vec![4.0, 5.0]);
    // An element stored into a tensor only on the device: the rest is
    // read back first.
    let bytes: Vec<u8> = [7i64, 8, 9].iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut s = Tensor::written_on_device(&[3], DType::I64, fake(bytes)).unwrap();
    s.set_index(&[IndexItem::Int(1)], &Value::Int(-1), &Interrupt::new())
        .unwrap();
    assert_eq!(s.to_f64_vec(), vec![7.0, -1.0, 9.0]);
}

#[test]
fn printing_is_numpy_like() {
    let t = Tensor::from_f64(&[2, 3], DType::F32, &[1.0, -2.5, 3.0, 10.0, 0.0, 1.0]);
    assert_eq!(
        t.to_string(),
        "tensor([[ 1.0000, -2.5000,  3.0000],\n        [10.0000,  0.0000,  1.0000]], f32)"
    );
    assert_eq!(
        Tensor::arange(0, 3, DType::I32).to_string(),
        "tensor([0, 1, 2], i32)"
    );
    let b = Tensor::from_f64(&[2], DType::Bool, &[1.0, 0.0]);
    assert_eq!(b.to_string(), "tensor([ True, False], bool)");
    let big = Tensor::zeros(&[40, 40], DType::F16);
    let s = big.to_string();
    assert!(s.contains("..."), "{s}");
    assert!(s.ends_with(", f16, shape=[40, 40])"), "{s}");
    assert_eq!(s.lines().count(), 7, "{s}");
    // f64 with 8 decimals, as numpy prints float64.
    assert_eq!(
        Tensor::full(&[], DType::F64, 2.0).to_string(),
        "tensor(2.00000000, f64)"
    );
    let third = Tensor::from_f64(&[2], DType::F64, &[1.0 / 3.0, 1e-9]);
    assert_eq!(
        third.to_string(),
        "tensor([3.33333333e-1, 1.00000000e-9], f64)"
    );
    // Empty tensors show their shape (else `[0, 3]` and `[3, 0]` look alike).
    assert_eq!(
        Tensor::zeros(&[0, 3], DType::F32).to_string(),
        "tensor([], f32, shape=[0, 3])"
    );
    assert_eq!(
        Tensor::zeros(&[0], DType::I32).to_string(),
        "tensor([], i32, shape=[0])"
    );
}

#[test]
fn indexing_copies_with_python_rules() {
    let t = Tensor::arange(0, 12, DType::I64).view(&[3, 4]).unwrap();
    let row = t.index(&[IndexItem::Int(-1)], &Interrupt::new()).unwrap();
    assert_eq!(
        (row.shape(), row.to_f64_vec()),
        (&[4usize][..], vec![8.0, 9.0, 10.0, 11.0])
    );
    let s = t
        .index(
            &[
                IndexItem::full(),
                IndexItem::Slice {
                    start: Some(3),
                    stop: None,
                    step: Some(-2),
                },
            ],
            &Interrupt::new(),
        )
        .unwrap();
    assert_eq!(s.shape(), &[3, 2]);
    assert_eq!(s.to_f64_vec(), vec![3.0, 1.0, 7.0, 5.0, 11.0, 9.0]);
    let n = t
        .index(&[IndexItem::NewAxis, IndexItem::Int(0)], &Interrupt::new())
        .unwrap();
    assert_eq!(n.shape(), &[1, 4]);
    assert!(!n.same_storage(&t));
    assert_eq!(
        t.index(&[IndexItem::Int(3)], &Interrupt::new())
            .unwrap_err()
            .code,
        "E0705"
    );
    // Aliases share storage; `to` and `deep_clone` copy.
    let alias = t.clone();
    alias
        .assign(&Tensor::zeros(&[3, 4], DType::I64), &Interrupt::new())
        .unwrap();
    assert_eq!(t.to_f64_vec(), vec![0.0; 12]);
    assert_eq!(t.to(DType::F16).dtype(), DType::F16);
    assert_eq!(
        Tensor::from_f64(&[2], DType::I8, &[300.0, -1.7]).to_f64_vec(),
        vec![127.0, -1.0]
    );
}
