//! A tensor's shared memory: the host's elements and, while a GPU uses
//! them, a device copy, with which side is current.

use super::*;

/// Tensor memory shared by every alias of a tensor. `UnsafeCell` because
/// kernel launches write it from several threads through raw pointers; the
/// data-race policy is the GPU's (see the module docs).
///
/// The elements may also have a copy in a GPU's memory (a [`Mirror`]): GPU
/// launches use and write that copy, and the host's is brought up to date
/// only when the host reads it ([`Storage::data`]: printing, saving,
/// comparing, host arithmetic), so that tensors stay on the GPU between
/// launches.
pub(crate) struct Storage {
    /// The host's elements; empty (though `numel` is not 0) while a tensor
    /// made on a GPU has never been read back: its host copy is made at
    /// the first host access, so that device-resident results cost no host
    /// memory. (Zeroed host memory is not free: glibc's heap hands out
    /// blocks under its mmap threshold, up to 32 MiB, that `calloc` must
    /// clear, which cost more than the GPU work of a 16 MiB all-reduce.)
    pub(super) host: UnsafeCell<Data>,
    pub(super) numel: usize,
    pub(super) mirror: Mutex<Option<Mirror>>,
}

// SAFETY: concurrent access happens only inside a launch, through raw pointers
// into the vector's buffer (never reallocated while shared); element races are
// the program's, as on the device. The mirror is behind a mutex.
unsafe impl Sync for Storage {}
// SAFETY: the data is owned (no thread-bound state); as for `Sync`.
unsafe impl Send for Storage {}

/// A storage's elements in a GPU's memory (implemented by `exec::cuda`).
pub(crate) trait DeviceBuffer: Send + Sync {
    /// Copies the device's bytes into `host` (exactly the buffer's length).
    fn read(&self, host: &mut [u8]) -> Result<(), ExecError>;
    /// Copies `host` (exactly the buffer's length) into the device's bytes.
    fn write(&self, host: &[u8]) -> Result<(), ExecError>;
    /// Sets every byte to 0.
    fn zero(&self) -> Result<(), ExecError>;
    /// Copies `src` (a buffer of the same length, possibly of another GPU)
    /// into this one, device to device.
    fn copy_from_device(&self, src: &dyn DeviceBuffer) -> Result<(), ExecError>;
    /// The device address of the first byte.
    fn address(&self) -> u64;
    /// Waits until the work queued on the GPU before this call (the
    /// writers of these bytes, collectives included) has finished, before
    /// another GPU reads the bytes.
    fn settle(&self) -> Result<(), ExecError>;
    /// Which GPU context holds it (a context made after a sticky error has
    /// a new one).
    fn owner(&self) -> u64;
}

/// Which copies of a mirrored storage hold its current elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Current {
    Host,
    Device,
    Both,
}

/// A storage's device copy and which side is current.
pub(super) struct Mirror {
    pub(super) buf: Box<dyn DeviceBuffer>,
    pub(super) current: Current,
}

impl Storage {
    pub(crate) fn new(d: Data) -> Arc<Storage> {
        Arc::new(Storage {
            numel: d.len(),
            host: UnsafeCell::new(d),
            mirror: Mutex::new(None),
        })
    }

    /// A storage of `numel` elements of `empty`'s type whose elements are
    /// in `mirror`; the host's copy is made (zeros, then the device's
    /// elements where it is current) at the first host access.
    pub(super) fn on_device(empty: Data, numel: usize, mirror: Mirror) -> Arc<Storage> {
        debug_assert_eq!(empty.len(), 0);
        Arc::new(Storage {
            host: UnsafeCell::new(empty),
            numel,
            mirror: Mutex::new(Some(mirror)),
        })
    }

    /// The host's elements as they are (not synced), made when missing.
    ///
    /// # Safety
    /// As [`Storage::host_bytes`]: no other reference to the host elements
    /// is used while the returned one lives.
    #[allow(clippy::mut_from_ref)] // the caller's contract above
    pub(super) unsafe fn host_slot(&self) -> &mut Data {
        // SAFETY: exclusivity is the caller's contract.
        let d = unsafe { &mut *self.host.get() };
        if d.len() != self.numel {
            // Zeroed pages are mapped lazily by the system for the large
            // sizes, so this costs nothing until the read-back writes them;
            // like any host allocation it aborts only if the system has no
            // memory at all (its size was checked against the available
            // memory when the tensor was made).
            *d = d
                .zeroed_like(self.numel)
                .unwrap_or_else(|layout| std::alloc::handle_alloc_error(layout));
        }
        d
    }

    /// The size of the elements in bytes (without making the host copy).
    pub(super) fn byte_len(&self) -> usize {
        // SAFETY: only the variant (the element type) is read.
        self.numel * unsafe { &*self.host.get() }.elem_bytes()
    }

    pub(super) fn mirror(&self) -> std::sync::MutexGuard<'_, Option<Mirror>> {
        self.mirror.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The host's elements, brought up to date from the device first.
    pub(crate) fn data(&self) -> &Data {
        self.sync_host();
        // SAFETY: see the module docs: no writer runs concurrently with a reader
        // outside a launch.
        unsafe { self.host_slot() }
    }

    /// The host's bytes (for copies to and from a device).
    ///
    /// # Safety
    /// No other reference to the host elements may be used while the slice
    /// lives (launches run one at a time; the host copy is only touched by
    /// the session's thread outside them).
    #[allow(clippy::mut_from_ref)] // the caller's contract above
    pub(super) unsafe fn host_bytes(&self) -> &mut [u8] {
        // SAFETY: the vector's buffer holds `len` elements of `elem_bytes`
        // each; exclusivity is the caller's contract.
        unsafe {
            let len = self.byte_len();
            std::slice::from_raw_parts_mut(self.host_ptr_unsynced(), len)
        }
    }

    /// Copies the device's elements to the host when only the device has
    /// them. A copy that fails (the GPU's context died: a sticky error)
    /// leaves the host's older elements and forgets the device copy; the
    /// session tells the user which tensors were lost (see
    /// [`Storage::forget_device`]).
    pub(super) fn sync_host(&self) {
        let mut m = self.mirror();
        if let Some(mirror) = m.as_mut() {
            if mirror.current == Current::Device {
                // SAFETY: the mirror's lock is held and no launch runs.
                let host = unsafe { self.host_bytes() };
                match mirror.buf.read(host) {
                    Ok(()) => mirror.current = Current::Both,
                    Err(_) => *m = None,
                }
            }
        }
    }

    pub(super) fn host_ptr_unsynced(&self) -> *mut u8 {
        // SAFETY: only the buffer pointer is taken; the vector is not resized
        // (but made, once, when missing).
        let d = unsafe { self.host_slot() };
        match d {
            Data::F64(v) => v.as_mut_ptr() as *mut u8,
            Data::F32(v) => v.as_mut_ptr() as *mut u8,
            Data::F16(v) => v.as_mut_ptr() as *mut u8,
            Data::BF16(v) => v.as_mut_ptr() as *mut u8,
            Data::I64(v) => v.as_mut_ptr() as *mut u8,
            Data::I32(v) => v.as_mut_ptr() as *mut u8,
            Data::I16(v) => v.as_mut_ptr() as *mut u8,
            Data::I8(v) => v.as_mut_ptr() as *mut u8,
            Data::U32(v) => v.as_mut_ptr() as *mut u8,
            Data::U8(v) => v.as_mut_ptr(),
        }
    }

    /// The base pointer of the host's elements (up to date), for CPU
    /// launches; a launch that writes them calls [`Storage::host_written`].
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.sync_host();
        self.host_ptr_unsynced()
    }

    /// The host's elements were written: a device copy is stale.
    pub(crate) fn host_written(&self) {
        if let Some(m) = self.mirror().as_mut() {
            m.current = Current::Host;
        }
    }

    /// The device address of the elements on the GPU context `owner`, up to
    /// date: the existing copy there, or one `alloc` makes (then the host's
    /// elements are copied in). A copy on another context is brought back
    /// to the host first.
    pub(crate) fn device_address(
        &self,
        owner: u64,
        alloc: impl FnOnce(usize) -> Result<Box<dyn DeviceBuffer>, ExecError>,
    ) -> Result<u64, ExecError> {
        let mut m = self.mirror();
        let mut alloc = Some(alloc);
        if m.as_ref().is_some_and(|x| x.buf.owner() != owner) {
            // Current only on another GPU: copied device to device (the
            // driver's unified addressing reaches every GPU), else through
            // the host.
            let only_there = m.as_ref().is_some_and(|x| x.current == Current::Device);
            let mut moved = None;
            if only_there {
                let len = self.byte_len();
                let make = alloc.take().expect("not used yet");
                let buf = make(len)?;
                let copied = m
                    .as_ref()
                    .is_some_and(|x| buf.copy_from_device(&*x.buf).is_ok());
                moved = Some((buf, copied));
            }
            match moved {
                Some((buf, true)) => {
                    *m = Some(Mirror {
                        buf,
                        current: Current::Device,
                    });
                }
                other => {
                    drop(m);
                    self.sync_host();
                    m = self.mirror();
                    *m = other.map(|(buf, _)| Mirror {
                        buf,
                        current: Current::Host,
                    });
                }
            }
        }
        let mirror = match m.as_mut() {
            Some(x) => x,
            None => {
                let make = alloc.take().expect("a mirror was made only when taken");
                m.insert(Mirror {
                    buf: make(self.byte_len())?,
                    current: Current::Host,
                })
            }
        };
        if mirror.current == Current::Host {
            // SAFETY: the mirror's lock is held and no launch runs.
            let host = unsafe { self.host_bytes() };
            mirror.buf.write(host)?;
            mirror.current = Current::Both;
        }
        Ok(mirror.buf.address())
    }

    /// A GPU launch wrote the device copy: the host's is stale.
    pub(crate) fn device_written(&self) {
        if let Some(m) = self.mirror().as_mut() {
            m.current = Current::Device;
        }
    }

    /// The GPU context holding a copy of the elements, if any.
    pub(crate) fn device_owner(&self) -> Option<u64> {
        self.mirror().as_ref().map(|m| m.buf.owner())
    }

    /// Brings the elements to the host and frees the device copy.
    pub(crate) fn to_host(&self) {
        self.sync_host();
        *self.mirror() = None;
    }

    /// Drops the device copy on context `owner` without reading it (the
    /// context died); true when it held the only current elements, which
    /// are then lost.
    pub(crate) fn forget_device(&self, owner: u64) -> bool {
        let mut m = self.mirror();
        match m.as_ref() {
            Some(x) if x.buf.owner() == owner => {
                let lost = x.current == Current::Device;
                *m = None;
                lost
            }
            _ => false,
        }
    }
}
