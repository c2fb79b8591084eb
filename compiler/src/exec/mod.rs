//! Execution on the CPU: tensors as values, kernel launches and whole-tensor
//! functions.
//!
//! * [`Tensor`] holds shared storage (aliases see each other's writes, kernel
//!   launches write their arguments in place); [`Value`] is what a Tessera
//!   expression evaluates to at run time.
//! * [`launch_kernel`] binds a kernel's signature to its arguments, specialises
//!   it, takes its Tile IR from the database and runs every program of the grid
//!   with the interpreter in [`cpu`] (programs in parallel).
//! * [`run_function`] runs a whole-tensor function through its Schedule IR: the
//!   same kernels, in the same order, the GPU would launch.
//!
//! Every failure is an [`ExecError`] with a code of the E07xx family (see
//! `docs/diagnostics.md`); [`ExecError::to_diagnostic`] attaches a span.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub mod autotune;
pub mod cpu;
pub mod cuda;
pub mod dist;
pub mod f8;
mod function;
mod launch;
pub mod npy;
pub mod rng;
mod tensor;

#[cfg(test)]
mod interrupt_tests;

pub use function::{run_function, run_function_in, run_schedule_on, On};
pub use launch::{compiled_specialization, launch_kernel, launch_specialization, LaunchSpec};
pub use tensor::{float_to_int, round_to, wrap_int, IndexItem, Tensor};

use crate::diag::Diagnostic;
use crate::syntax::span::Span;

/// Where kernels run: the CPU executor, or a GPU through the CUDA driver.
#[derive(Clone, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda(Arc<cuda::Gpu>),
}

impl Device {
    /// Runs every program of `grid` of a specialised `kernel` on `args` here.
    pub(crate) fn run_grid(
        &self,
        kernel: &Arc<crate::ir::tile::Kernel>,
        args: &[cpu::Arg],
        grid: [i64; 3],
        interrupt: &Interrupt,
    ) -> Result<(), ExecError> {
        match self {
            Device::Cpu => cpu::run_grid(kernel, args, grid, interrupt),
            Device::Cuda(gpu) => gpu.launch(kernel, args, grid, interrupt),
        }
    }
}

impl Device {
    /// A tensor of zeros where this device's kernels find it.
    pub fn zeros(
        &self,
        shape: &[usize],
        dtype: crate::check::DType,
        interrupt: &Interrupt,
    ) -> Result<Tensor, ExecError> {
        match self {
            Device::Cpu => Tensor::try_zeros(shape, dtype, interrupt),
            Device::Cuda(gpu) => gpu.zeros(shape, dtype),
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(gpu) => write!(f, "{}", gpu.info()),
        }
    }
}

/// A run-time value.
#[derive(Clone, Debug)]
pub enum Value {
    Tensor(Tensor),
    Int(i64),
    Float(f64),
    Bool(bool),
    Tuple(Vec<Value>),
    None,
}

impl Value {
    /// The kind of value, for messages (`tensor[4, 8] f32`, `int`).
    pub fn describe(&self) -> String {
        match self {
            // Written as the checker writes types: `Tensor[1001, f32]`.
            Value::Tensor(t) => {
                let mut s = String::from("Tensor[");
                for d in t.shape() {
                    s.push_str(&format!("{d}, "));
                }
                format!("{s}{}]", t.dtype())
            }
            Value::Int(_) => "int".into(),
            Value::Float(_) => "float".into(),
            Value::Bool(_) => "bool".into(),
            Value::Tuple(v) => format!("tuple of {}", v.len()),
            Value::None => "None".into(),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Tensor(t) => write!(f, "{t}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => {
                if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e16 {
                    write!(f, "{x:.1}")
                } else {
                    write!(f, "{x}")
                }
            }
            Value::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            Value::Tuple(v) => {
                f.write_str("(")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{x}")?;
                }
                if v.len() == 1 {
                    f.write_str(",")?;
                }
                f.write_str(")")
            }
            Value::None => f.write_str("None"),
        }
    }
}

/// A run-time error: a catalogue code (E07xx), a message and a help line.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecError {
    pub code: &'static str,
    pub message: String,
    pub help: Option<String>,
    /// The parameter whose argument is at fault, for a caller that can
    /// underline that argument instead of the whole call.
    pub param: Option<String>,
    /// The positional argument at fault (0-based) when no parameter takes it:
    /// the first one too many.
    pub arg: Option<usize>,
}

impl ExecError {
    pub fn new(code: &'static str, message: impl Into<String>) -> ExecError {
        ExecError {
            code,
            message: message.into(),
            help: None,
            param: None,
            arg: None,
        }
    }

    /// Marks the error as about the positional argument `index`.
    pub fn at_arg(mut self, index: usize) -> ExecError {
        self.arg = Some(index);
        self
    }

    /// Marks the error as about the argument of parameter `name`.
    pub fn at_param(mut self, name: impl Into<String>) -> ExecError {
        self.param = Some(name.into());
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> ExecError {
        self.help = Some(help.into());
        self
    }

    /// The diagnostic of this error at `span` (the call or statement that failed).
    pub fn to_diagnostic(&self, span: Span) -> Diagnostic {
        let d = Diagnostic::new(self.code, span, self.message.clone());
        match &self.help {
            Some(h) => d.with_help(h.clone()),
            None => d,
        }
    }

    pub(crate) fn interrupted() -> ExecError {
        ExecError::new("E0706", "interrupted").with_help(
            "the computation was stopped (Ctrl-C); tensors it was writing may be partly written",
        )
    }
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error[{}]: {}", self.code, self.message)?;
        if let Some(h) = &self.help {
            write!(f, "\n  help: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ExecError {}

/// Elements a host loop (creation, conversion, copy, indexing) handles between
/// two looks at the [`Interrupt`]: one relaxed atomic load per 64K elements
/// costs nothing measurable, and 64K elements take well under a millisecond.
pub(crate) const POLL_EVERY: usize = 1 << 16;

/// A flag that stops a running computation: set it (from a Ctrl-C handler) and
/// the executor returns E0706 at the next program, loop iteration or chunk of
/// [`POLL_EVERY`] elements of a host operation.
#[derive(Clone, Debug, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    pub fn new() -> Interrupt {
        Interrupt::default()
    }

    /// Requests a stop.
    pub fn trigger(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Clears a request (before the next computation).
    pub fn reset(&self) {
        self.0.store(false, Ordering::Relaxed);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// `Err(E0706)` once triggered.
    pub fn check(&self) -> Result<(), ExecError> {
        if self.is_set() {
            Err(ExecError::interrupted())
        } else {
            Ok(())
        }
    }

    /// Runs `f` on `0..n` in ranges of [`POLL_EVERY`], in order, checking the
    /// flag before each: E0706 once triggered (the ranges before it are done).
    pub(crate) fn chunks(
        &self,
        n: usize,
        mut f: impl FnMut(std::ops::Range<usize>),
    ) -> Result<(), ExecError> {
        let mut lo = 0;
        while lo < n {
            self.check()?;
            let hi = lo + POLL_EVERY.min(n - lo);
            f(lo..hi);
            lo = hi;
        }
        Ok(())
    }

    /// The shared flag, for signal handlers (`ctrlc::set_handler`).
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}
