//! The HIP printer: Target IR → HIP C++, one self-contained translation unit
//! per file, for AMD targets (gfx90a, gfx942, gfx1100).
//!
//! It prints the program `ir::target::lower` made for the arch — the same
//! one the PTX printer prints for NVIDIA arches — as C++ for clang's AMDGPU
//! back end. The unit includes nothing and needs no ROCm device library
//! (`clang++ -x hip --offload-arch=ARCH --cuda-device-only -nogpulib
//! -nogpuinc`): thread and block ids, barriers and fences, cross-lane moves
//! and fast math are `__builtin_amdgcn_*` builtins; the few keywords HIP's
//! headers would define (`__global__`, `__shared__`, `__launch_bounds__`,
//! `__device__`) are defined at the top, as attributes clang knows.
//!
//! Kernel ABI (what a launcher passes, in order), the PTX printer's: for each
//! Tile IR parameter in signature order, a tensor as a global pointer and a
//! scalar by value (`float`, `double`, `long long`, 32-bit integers and bools
//! as `int`/`unsigned`, f16/bf16 as 16 bits in an `unsigned short`); then each
//! distinct run-time tensor dim, as `int`. The block is one-dimensional with
//! `num_warps * wave` threads (64-lane waves on CDNA, 32 on RDNA3); the grid
//! is the kernel's. Shared memory is one static `__shared__` arena.
//!
//! Target IR registers are C locals named as in the Target IR dump (`r12`,
//! `f3`, `p7`, `b2`), declared at the top of the kernel; control flow is C's
//! `for`/`while`/`if`. The program means what its PTX means, so operations C
//! leaves undefined are spelled as PTX defines them: signed integer
//! arithmetic wraps (computed unsigned), shifts by the width or more give 0
//! (or the sign), float-to-integer conversions saturate (NaN gives 0), and
//! integer division by zero gives a value instead of undefined behaviour
//! (all ones; the remainder is the dividend — PTX leaves both unspecified).
//! Memory is read and written through `may_alias` types, so reusing the
//! shared arena for values of another type is well defined.

pub mod clang;
mod matrix;

use std::collections::BTreeSet;
use std::fmt::Write;

use super::print::{self, axis, conversion, ident, mul_wide_signed, store_ty, Conversion};
use crate::ir::target::{
    reg_name, BinOp, CmpOp, Inst, Kernel, MemTy, Operand, Reg, RegTy, Space, Special, UnOp,
};
use crate::target::Arch;

/// Why the HIP printer refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HipError {
    /// The kernel or module is for an NVIDIA target (its output is PTX).
    NotAmd(Arch),
    /// The kernel holds an instruction HIP on this arch cannot express (an
    /// NVIDIA instruction that lowering for an AMD arch does not emit).
    Inexpressible { arch: Arch, what: String },
}

impl std::fmt::Display for HipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HipError::NotAmd(a) => write!(
                f,
                "{a} is an NVIDIA target and has no HIP (HIP is for AMD targets: gfx90a, gfx942, gfx1100); its output is PTX"
            ),
            HipError::Inexpressible { arch, what } => {
                write!(f, "{what} has no HIP form on {arch}")
            }
        }
    }
}

impl std::error::Error for HipError {}

fn is_amd(arch: Arch) -> Result<(), HipError> {
    if arch.is_nvidia() {
        Err(HipError::NotAmd(arch))
    } else {
        Ok(())
    }
}

/// One HIP translation unit holding `kernels` (all lowered for `arch`).
pub fn module(arch: Arch, kernels: &[Kernel]) -> Result<String, HipError> {
    print::module(kernels, kernel_text, |texts| module_of(arch, texts))
}

/// The definition of one kernel, as [`module`] places it: printed on its own
/// so that the query layer can cache it per kernel.
pub fn kernel_text(k: &Kernel) -> Result<String, HipError> {
    is_amd(k.arch)?;
    let mut p = Printer {
        k,
        names: (0..k.regs.len())
            .map(|i| reg_name(k.regs[i], i as u32))
            .collect(),
        out: String::new(),
    };
    p.block(&k.body, 1)?;
    let mut out = String::new();
    let params: Vec<String> = k
        .params
        .iter()
        .map(|prm| {
            let t = param_cty(prm.ty);
            let sep = if t.ends_with('*') { "" } else { " " };
            format!("{t}{sep}{}", param_name(&prm.name))
        })
        .collect();
    let head = format!(
        "extern \"C\" __global__ __launch_bounds__({}) void",
        k.num_threads
    );
    let params = params.join(", ");
    if clashes(&k.name) {
        // A C++ keyword (`new`) or one of the printer's names: the function
        // gets another C name and keeps the kernel's as its symbol.
        let c = format!("tsr_kernel_{}", k.name);
        let _ = writeln!(out, "{head} {c}({params}) __asm__(\"{}\");", k.name);
        let _ = writeln!(out, "{head} {c}({params}) {{");
    } else {
        let _ = writeln!(out, "{head} {}({params}) {{", k.name);
    }
    if k.smem_bytes() > 0 {
        let _ = writeln!(
            out,
            "  __shared__ __attribute__((aligned(16))) unsigned char tsr_smem[{}];",
            k.smem_bytes()
        );
    }
    // Every register, by type; zero-initialised (the verifier guarantees a
    // definition before each use, so this only keeps clang from guessing).
    for t in [
        RegTy::Pred,
        RegTy::I32,
        RegTy::U32,
        RegTy::B32,
        RegTy::I64,
        RegTy::U64,
        RegTy::F32,
        RegTy::F64,
        RegTy::B16,
    ] {
        let names: Vec<String> = k
            .regs
            .iter()
            .enumerate()
            .filter(|(_, &rt)| rt == t)
            .map(|(i, _)| format!("{} = {}", p.names[i], zero(t)))
            .collect();
        for chunk in names.chunks(8) {
            let _ = writeln!(out, "  {} {};", cty(t), chunk.join(", "));
        }
    }
    out.push_str(&p.out);
    out.push_str("}\n");
    Ok(out)
}

/// One HIP translation unit for `arch` holding kernels already printed by
/// [`kernel_text`]: a header, the definitions the kernels use, the kernels.
pub fn module_of(arch: Arch, kernels: &[impl AsRef<str>]) -> Result<String, HipError> {
    is_amd(arch)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// Generated by tsrc (Tessera) for {arch} ({}-lane waves): HIP C++, self-contained.\n\
         // clang++ -x hip --offload-arch={arch} --cuda-device-only -nogpulib -nogpuinc -O3 \\\n\
         //     --no-gpu-bundle-output -o kernels.hsaco THIS_FILE\n",
        arch.info().warp_size
    );
    out.push_str(PRELUDE);
    let mut used = BTreeSet::new();
    for k in kernels {
        tokens(k.as_ref(), &mut used);
    }
    // Definitions may use others (found in their text): to a fixed point.
    let mut defs: Vec<(usize, String, String)> = Vec::new();
    let mut todo: Vec<String> = used.iter().cloned().collect();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        if let Some((rank, text)) = definition(&name) {
            let mut more = BTreeSet::new();
            tokens(&text, &mut more);
            todo.extend(more.into_iter().filter(|n| n != &name));
            defs.push((rank, name, text));
        }
    }
    defs.sort();
    for (_, _, text) in &defs {
        out.push_str(text);
        out.push('\n');
    }
    for k in kernels {
        out.push('\n');
        out.push_str(k.as_ref());
    }
    Ok(out)
}

/// The keywords HIP's headers would define, as clang attributes (guarded,
/// so the unit also compiles with the headers).
const PRELUDE: &str = "#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif
#ifndef __launch_bounds__
#define __launch_bounds__(n) __attribute__((amdgpu_flat_work_group_size(n, n)))
#endif
#define TSR_GLOBAL __attribute__((address_space(1)))
#define TSR_INLINE static __device__ inline __attribute__((always_inline))
";

/// The `tsr_*` identifiers of `text`.
fn tokens(text: &str, out: &mut BTreeSet<String>) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("tsr_") {
        let start = i + at;
        let before_ok = start == 0 || {
            let c = bytes[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_')
        };
        let mut end = start + 4;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if before_ok {
            out.insert(text[start..end].to_string());
        }
        i = end;
    }
}

/// The C type of a memory element, as its `may_alias` typedef's name part.
fn mem_c(m: MemTy) -> (&'static str, &'static str) {
    match m {
        MemTy::F64 => ("f64", "double"),
        MemTy::F32 => ("f32", "float"),
        MemTy::F16 | MemTy::BF16 | MemTy::U16 => ("u16", "unsigned short"),
        MemTy::I64 => ("i64", "long long"),
        MemTy::I32 => ("i32", "int"),
        MemTy::I16 => ("i16", "short"),
        MemTy::I8 => ("i8", "signed char"),
        MemTy::U32 => ("u32", "unsigned"),
        MemTy::U8 | MemTy::F8E4M3 | MemTy::F8E5M2 => ("u8", "unsigned char"),
    }
}

/// The definition of a `tsr_*` name the printed kernels use, with its rank
/// in the unit (types before functions). `None` for names defined elsewhere
/// (`tsr_smem`, the prelude's macros).
fn definition(name: &str) -> Option<(usize, String)> {
    let rest = name.strip_prefix("tsr_")?;
    // Memory element types: `tsr_f32`, vectors `tsr_f32x4`.
    let scalar = |s: &str| -> Option<&'static str> {
        [
            MemTy::F64,
            MemTy::F32,
            MemTy::U16,
            MemTy::I64,
            MemTy::I32,
            MemTy::I16,
            MemTy::I8,
            MemTy::U32,
            MemTy::U8,
        ]
        .into_iter()
        .map(mem_c)
        .find(|(n, _)| *n == s)
        .map(|(_, c)| c)
    };
    if let Some(c) = scalar(rest) {
        return Some((0, format!("typedef {c} __attribute__((may_alias)) {name};")));
    }
    if let Some((s, n)) = rest.split_once('x') {
        if let (Some(c), Ok(n)) = (scalar(s), n.parse::<u32>()) {
            return Some((
                1,
                format!("typedef {c} __attribute__((ext_vector_type({n}), may_alias)) {name};"),
            ));
        }
    }
    let f = |body: &str| Some((2, format!("TSR_INLINE {body}")));
    match rest {
        // Integer division as PTX's `div`/`rem`, without C's undefined cases.
        "div_i32" => f("int tsr_div_i32(int a, int b) { return b == 0 ? -1 : b == -1 ? (int)(0u - (unsigned)a) : a / b; }"),
        "rem_i32" => f("int tsr_rem_i32(int a, int b) { return b == 0 ? a : b == -1 ? 0 : a % b; }"),
        "div_u32" => f("unsigned tsr_div_u32(unsigned a, unsigned b) { return b == 0 ? 0xffffffffu : a / b; }"),
        "rem_u32" => f("unsigned tsr_rem_u32(unsigned a, unsigned b) { return b == 0 ? a : a % b; }"),
        "div_i64" => f("long long tsr_div_i64(long long a, long long b) { return b == 0 ? -1 : b == -1 ? (long long)(0ull - (unsigned long long)a) : a / b; }"),
        "rem_i64" => f("long long tsr_rem_i64(long long a, long long b) { return b == 0 ? a : b == -1 ? 0 : a % b; }"),
        "div_u64" => f("unsigned long long tsr_div_u64(unsigned long long a, unsigned long long b) { return b == 0 ? ~0ull : a / b; }"),
        "rem_u64" => f("unsigned long long tsr_rem_u64(unsigned long long a, unsigned long long b) { return b == 0 ? a : a % b; }"),
        // Shifts by a run-time amount, clamped at the width as PTX does.
        "shl_i32" => f("int tsr_shl_i32(int a, int b) { return (unsigned)b >= 32u ? 0 : (int)((unsigned)a << b); }"),
        "shl_u32" => f("unsigned tsr_shl_u32(unsigned a, unsigned b) { return b >= 32u ? 0u : a << b; }"),
        "shl_i64" => f("long long tsr_shl_i64(long long a, long long b) { return (unsigned long long)b >= 64ull ? 0 : (long long)((unsigned long long)a << b); }"),
        "shl_u64" => f("unsigned long long tsr_shl_u64(unsigned long long a, unsigned long long b) { return b >= 64ull ? 0ull : a << b; }"),
        "shr_i32" => f("int tsr_shr_i32(int a, int b) { return (unsigned)b >= 32u ? a >> 31 : a >> b; }"),
        "shr_u32" => f("unsigned tsr_shr_u32(unsigned a, unsigned b) { return b >= 32u ? 0u : a >> b; }"),
        "shr_i64" => f("long long tsr_shr_i64(long long a, long long b) { return (unsigned long long)b >= 64ull ? a >> 63 : a >> b; }"),
        "shr_u64" => f("unsigned long long tsr_shr_u64(unsigned long long a, unsigned long long b) { return b >= 64ull ? 0ull : a >> b; }"),
        // f32 rounded to tf32 (nearest, ties away), as `cvt.rna.tf32.f32`.
        "tf32" => f("unsigned tsr_tf32(float x) { unsigned u = __builtin_bit_cast(unsigned, x); return (u & 0x7f800000u) == 0x7f800000u ? u : (u + 0x1000u) & 0xffffe000u; }"),
        // The number of blocks along an axis, from the dispatch packet
        // (grid size in work-items at byte 12, block size at byte 4).
        "num_groups" => f("int tsr_num_groups(int axis) { const __attribute__((address_space(4))) unsigned char *p = (const __attribute__((address_space(4))) unsigned char *)__builtin_amdgcn_dispatch_ptr(); unsigned grid = *(const __attribute__((address_space(4))) unsigned *)(p + 12 + 4 * axis); unsigned block = *(const __attribute__((address_space(4))) unsigned short *)(p + 4 + 2 * axis); return (int)((grid + block - 1u) / block); }"),
        _ => {
            // Saturating float-to-integer conversions: `tsr_cvt_{int}_{float}`.
            let (to, from) = rest.strip_prefix("cvt_")?.split_once('_')?;
            let (ft, fsuffix) = match from {
                "f32" => ("float", "f"),
                "f64" => ("double", ""),
                _ => return None,
            };
            let (it, lo, hi, max) = match to {
                "i32" => ("int", "-2147483648.0", "2147483648.0", "2147483647"),
                "u32" => ("unsigned", "0.0", "4294967296.0", "0xffffffffu"),
                "i64" => ("long long", "-9223372036854775808.0", "9223372036854775808.0", "9223372036854775807LL"),
                "u64" => ("unsigned long long", "0.0", "18446744073709551616.0", "~0ull"),
                _ => return None,
            };
            let min = if to.starts_with('i') {
                if to == "i32" { "(-2147483647 - 1)" } else { "(-9223372036854775807LL - 1)" }
            } else {
                "0"
            };
            f(&format!(
                "{it} tsr_cvt_{to}_{from}({ft} x) {{ return x != x ? 0 : x <= {lo}{fsuffix} ? {min} : x >= {hi}{fsuffix} ? {max} : ({it})x; }}"
            ))
        }
    }
}

fn cty(t: RegTy) -> &'static str {
    match t {
        RegTy::Pred => "bool",
        RegTy::I32 => "int",
        RegTy::U32 | RegTy::B32 => "unsigned",
        RegTy::I64 => "long long",
        RegTy::U64 => "unsigned long long",
        RegTy::F32 => "float",
        RegTy::F64 => "double",
        RegTy::B16 => "unsigned short",
    }
}

fn zero(t: RegTy) -> &'static str {
    match t {
        RegTy::Pred => "false",
        _ => "0",
    }
}

/// The short name of an integer type in helper names (`tsr_div_i32`).
fn int_name(t: RegTy) -> &'static str {
    match t {
        RegTy::I32 => "i32",
        RegTy::U32 | RegTy::B32 | RegTy::B16 | RegTy::Pred => "u32",
        RegTy::I64 => "i64",
        RegTy::U64 => "u64",
        RegTy::F32 => "f32",
        RegTy::F64 => "f64",
    }
}

/// The unsigned type of the same width (for wrapping arithmetic).
fn unsigned_of(t: RegTy) -> &'static str {
    match t {
        RegTy::I64 | RegTy::U64 => "unsigned long long",
        _ => "unsigned",
    }
}

fn bits_of(t: RegTy) -> u32 {
    match t {
        RegTy::Pred => 1,
        RegTy::B16 => 16,
        RegTy::I32 | RegTy::U32 | RegTy::B32 | RegTy::F32 => 32,
        RegTy::I64 | RegTy::U64 | RegTy::F64 => 64,
    }
}

fn param_cty(t: RegTy) -> &'static str {
    match t {
        RegTy::U64 => "void *",
        RegTy::I64 => "long long",
        RegTy::F32 => "float",
        RegTy::F64 => "double",
        RegTy::B16 => "unsigned short",
        RegTy::U32 | RegTy::B32 | RegTy::Pred => "unsigned",
        RegTy::I32 => "int",
    }
}

/// C++ keywords and the names the printer uses itself: a parameter named so
/// gets a suffix.
const RESERVED: &[&str] = &[
    "alignas",
    "alignof",
    "and",
    "and_eq",
    "asm",
    "auto",
    "bitand",
    "bitor",
    "bool",
    "break",
    "case",
    "catch",
    "char",
    "char8_t",
    "char16_t",
    "char32_t",
    "class",
    "compl",
    "concept",
    "const",
    "consteval",
    "constexpr",
    "constinit",
    "const_cast",
    "continue",
    "co_await",
    "co_return",
    "co_yield",
    "decltype",
    "default",
    "delete",
    "do",
    "double",
    "dynamic_cast",
    "else",
    "enum",
    "explicit",
    "export",
    "extern",
    "false",
    "float",
    "for",
    "friend",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "mutable",
    "namespace",
    "new",
    "noexcept",
    "not",
    "not_eq",
    "nullptr",
    "operator",
    "or",
    "or_eq",
    "private",
    "protected",
    "public",
    "register",
    "reinterpret_cast",
    "requires",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "static_assert",
    "static_cast",
    "struct",
    "switch",
    "template",
    "this",
    "thread_local",
    "throw",
    "true",
    "try",
    "typedef",
    "typeid",
    "typename",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "wchar_t",
    "while",
    "xor",
    "xor_eq",
];

/// A C identifier for a parameter name: letters, digits and `_` kept, any
/// other character `c` written `_xHH_` (run-time dims may be named by
/// expressions such as `M+1`); a keyword, a register-like name (`r12`) or a
/// printer name (`tsr_*`) gets `_arg` appended.
fn param_name(name: &str) -> String {
    let mut out = ident(name);
    let register_like = out.len() > 1
        && matches!(out.as_bytes()[0], b'r' | b'p' | b'f' | b'b')
        && out[1..].bytes().all(|c| c.is_ascii_digit());
    if register_like || clashes(&out) {
        out.push_str("_arg");
    }
    out
}

/// Whether a name cannot be a C identifier of the unit as it is: a C++
/// keyword, a reserved name (`__x`), or one of the printer's (`tsr_*`,
/// `TSR_*`).
fn clashes(name: &str) -> bool {
    RESERVED.contains(&name)
        || name.starts_with("tsr_")
        || name.starts_with("__")
        || name.starts_with("TSR_")
}

/// An f32 literal that reads back as `f`'s f32 value.
fn f32_lit(f: f64) -> String {
    let x = f as f32;
    float_lit(
        format!("{x:?}"),
        x.is_nan(),
        x.is_infinite(),
        x.is_sign_negative(),
        "f",
    )
}

fn f64_lit(f: f64) -> String {
    float_lit(
        format!("{f:?}"),
        f.is_nan(),
        f.is_infinite(),
        f.is_sign_negative(),
        "",
    )
}

/// A float literal: `digits` (Rust's shortest round-trip form) with `suffix`
/// (`f` for f32), or the builtin of that suffix for a NaN or an infinity;
/// negative values in parentheses.
fn float_lit(digits: String, nan: bool, infinite: bool, negative: bool, suffix: &str) -> String {
    let v = if nan {
        format!("__builtin_nan{suffix}(\"\")")
    } else if infinite {
        let sign = if negative { "-" } else { "" };
        format!("{sign}__builtin_inf{suffix}()")
    } else {
        format!("{digits}{suffix}")
    };
    if negative && !nan {
        format!("({v})")
    } else {
        v
    }
}

/// An integer literal of type `t` (wrapped to its width).
fn int_lit(i: i64, t: RegTy) -> String {
    match t {
        RegTy::Pred => if i != 0 { "true" } else { "false" }.to_string(),
        RegTy::I32 => match i as i32 {
            i32::MIN => "(-2147483647 - 1)".to_string(),
            v if v < 0 => format!("({v})"),
            v => v.to_string(),
        },
        RegTy::U32 | RegTy::B32 => format!("{}u", i as u32),
        RegTy::I64 => match i {
            i64::MIN => "(-9223372036854775807LL - 1)".to_string(),
            v if v < 0 => format!("({v}LL)"),
            v => format!("{v}LL"),
        },
        RegTy::U64 => format!("{}ull", i as u64),
        RegTy::B16 => format!("(unsigned short){}u", i as u16),
        RegTy::F32 => f32_lit(i as f64),
        RegTy::F64 => f64_lit(i as f64),
    }
}

struct Printer<'a> {
    k: &'a Kernel,
    names: Vec<String>,
    out: String,
}

type R<T> = Result<T, HipError>;

impl Printer<'_> {
    fn r(&self, r: Reg) -> &str {
        &self.names[r.0 as usize]
    }

    fn ty(&self, r: Reg) -> RegTy {
        self.k.reg_ty(r)
    }

    fn inexpressible<T>(&self, what: impl Into<String>) -> R<T> {
        Err(HipError::Inexpressible {
            arch: self.k.arch,
            what: what.into(),
        })
    }

    /// Register `r` as a value of type `t`: itself, a C conversion between
    /// integer types (the same bits at the same width) or a bit cast between
    /// an integer and a float of one width.
    fn cast(&self, r: Reg, t: RegTy) -> String {
        let rt = self.ty(r);
        let name = self.r(r);
        if rt == t || (cty(rt) == cty(t)) {
            return name.to_string();
        }
        if t == RegTy::Pred {
            return format!("({name} != 0)");
        }
        if bits_of(rt) == bits_of(t) && (rt.is_float() != t.is_float()) {
            return format!("__builtin_bit_cast({}, {name})", cty(t));
        }
        format!("({}){name}", cty(t))
    }

    /// An operand as a value of type `t`.
    fn o(&self, o: Operand, t: RegTy) -> String {
        match o {
            Operand::Reg(r) => self.cast(r, t),
            Operand::Int(i) => int_lit(i, t),
            Operand::Float(f) => match t {
                RegTy::F32 => f32_lit(f),
                RegTy::F64 => f64_lit(f),
                _ => int_lit(f as i64, t),
            },
        }
    }

    fn line(&mut self, depth: usize, s: &str) {
        for _ in 0..depth {
            self.out.push_str("  ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn block(&mut self, insts: &[Inst], depth: usize) -> R<()> {
        for i in insts {
            crate::cancel::checkpoint();
            self.inst(i, depth)?;
        }
        Ok(())
    }

    /// `a op b` at type `t`, wrapping for signed integers (computed in the
    /// unsigned type of their width).
    fn arith(&self, op: &str, t: RegTy, a: Operand, b: Operand) -> String {
        match t {
            RegTy::I32 | RegTy::I64 => {
                let ut = if t == RegTy::I64 {
                    RegTy::U64
                } else {
                    RegTy::U32
                };
                format!("({})({} {op} {})", cty(t), self.o(a, ut), self.o(b, ut))
            }
            _ => format!("{} {op} {}", self.o(a, t), self.o(b, t)),
        }
    }

    fn inst(&mut self, i: &Inst, depth: usize) -> R<()> {
        let k = self.k;
        let s = match i {
            Inst::Comment(c) => format!("// {}", c.replace('\n', " ")),
            Inst::Param { dst, index } => {
                let prm = &k.params[*index];
                let name = param_name(&prm.name);
                let t = self.ty(*dst);
                let v = match (prm.ty, t) {
                    (RegTy::U64, RegTy::U64) => format!("(unsigned long long){name}"),
                    (RegTy::U64, _) => format!("({})(unsigned long long){name}", cty(t)),
                    (_, RegTy::Pred) => format!("{name} != 0"),
                    (pt, t) if param_cty(pt) == cty(t) => name,
                    _ => format!("({}){name}", cty(t)),
                };
                format!("{} = {v};", self.r(*dst))
            }
            Inst::Special { dst, which } => {
                let v = match which {
                    Special::ThreadId => "__builtin_amdgcn_workitem_id_x()".to_string(),
                    Special::BlockId(a) => format!("__builtin_amdgcn_workgroup_id_{}()", axis(*a)),
                    Special::NumBlocks(a) => format!("tsr_num_groups({})", (*a).min(2)),
                };
                format!("{} = ({}){v};", self.r(*dst), cty(self.ty(*dst)))
            }
            Inst::SmemAddr { dst, buffer } => {
                let b = &k.smem[*buffer];
                format!(
                    "{} = {}; // {} (offset in tsr_smem)",
                    self.r(*dst),
                    int_lit(b.offset as i64, self.ty(*dst)),
                    b.name
                )
            }
            Inst::Mov { dst, src } => {
                let t = self.ty(*dst);
                format!("{} = {};", self.r(*dst), self.o(*src, t))
            }
            Inst::Unary { op, dst, x: xo } => {
                let t = self.ty(*dst);
                let x = self.o(*xo, t);
                let f32 = t == RegTy::F32;
                let v = match op {
                    UnOp::Neg if t.is_float() => format!("-{x}"),
                    UnOp::Neg => self.arith("-", t, Operand::Int(0), *xo),
                    UnOp::Not if t == RegTy::Pred => format!("!{x}"),
                    UnOp::Not => format!("~{x}"),
                    UnOp::Abs if f32 => format!("__builtin_fabsf({x})"),
                    UnOp::Abs if t == RegTy::F64 => format!("__builtin_fabs({x})"),
                    UnOp::Abs => format!(
                        "{x} < 0 ? {} : {x}",
                        self.arith("-", t, Operand::Int(0), *xo)
                    ),
                    // v_exp_f32 flushes subnormal results; `__builtin_exp2f`
                    // (llvm.exp2) scales them back, as `Exp2Approx` keeps them.
                    UnOp::Exp2Approx if f32 => format!("__builtin_exp2f({x})"),
                    UnOp::Exp2ApproxFtz if f32 => format!("__builtin_amdgcn_exp2f({x})"),
                    UnOp::Log2Approx if f32 => format!("__builtin_amdgcn_logf({x})"),
                    UnOp::RsqrtApprox if f32 => format!("__builtin_amdgcn_rsqf({x})"),
                    UnOp::Sqrt if f32 => format!("__builtin_sqrtf({x})"),
                    UnOp::Sqrt if t == RegTy::F64 => format!("__builtin_sqrt({x})"),
                    UnOp::Rcp if f32 => format!("1.0f / {x}"),
                    UnOp::Rcp if t == RegTy::F64 => format!("1.0 / {x}"),
                    UnOp::Floor if f32 => format!("__builtin_floorf({x})"),
                    UnOp::Floor if t == RegTy::F64 => format!("__builtin_floor({x})"),
                    op => return self.inexpressible(format!("`{op:?}` on {}", t.name())),
                };
                format!("{} = {v};", self.r(*dst))
            }
            Inst::Binary { op, dst, a, b } => {
                let t = self.ty(*dst);
                let v = self.binary(*op, t, *a, *b)?;
                format!("{} = {v};", self.r(*dst))
            }
            Inst::Fma { dst, a, b, c } => {
                let t = self.ty(*dst);
                let (a, b, c) = (self.o(*a, t), self.o(*b, t), self.o(*c, t));
                let v = match t {
                    RegTy::F32 => format!("__builtin_fmaf({a}, {b}, {c})"),
                    RegTy::F64 => format!("__builtin_fma({a}, {b}, {c})"),
                    _ => {
                        let u = unsigned_of(t);
                        format!("({})(({u}){a} * ({u}){b} + ({u}){c})", cty(t))
                    }
                };
                format!("{} = {v};", self.r(*dst))
            }
            Inst::MulWide { dst, a, b } => {
                let (t32, t64) = if mul_wide_signed(k, *a) {
                    (RegTy::I32, RegTy::I64)
                } else {
                    (RegTy::U32, RegTy::U64)
                };
                // A 32-bit operand widened (a literal written at 64 bits).
                let wide = |o: &Operand| match o {
                    Operand::Reg(_) => format!("({}){}", cty(t64), self.o(*o, t32)),
                    o => self.o(*o, t64),
                };
                let v = format!("{} * {}", wide(a), wide(b));
                let dt = self.ty(*dst);
                if cty(dt) == cty(t64) {
                    format!("{} = {v};", self.r(*dst))
                } else {
                    format!("{} = ({})({v});", self.r(*dst), cty(dt))
                }
            }
            Inst::Cmp { op, ty, dst, a, b } => {
                let c = match op {
                    CmpOp::Eq => "==",
                    // C's `!=` is unordered for floats, as `neu` is.
                    CmpOp::Ne => "!=",
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                    CmpOp::Gt => ">",
                    CmpOp::Ge => ">=",
                };
                format!(
                    "{} = {} {c} {};",
                    self.r(*dst),
                    self.o(*a, *ty),
                    self.o(*b, *ty)
                )
            }
            Inst::Select { dst, cond, a, b } => {
                let t = self.ty(*dst);
                format!(
                    "{} = {} ? {} : {};",
                    self.r(*dst),
                    self.r(*cond),
                    self.o(*a, t),
                    self.o(*b, t)
                )
            }
            Inst::Cvt { dst, src, narrow } => self.cvt(*dst, *src, *narrow),
            Inst::Ld {
                // The `.cs` hint is PTX's; HIP's accesses stay plain.
                stream: _,
                space,
                mem,
                dst,
                addr,
                offset,
                pred,
            } => {
                let (tn, _) = mem_c(*mem);
                let at = self.address(*space, *addr, *offset);
                let s = if dst.len() == 1 {
                    let t = self.ty(dst[0]);
                    let v = from_mem(&format!("*({}tsr_{tn} *)({at})", qual(*space)), *mem, t);
                    format!("{} = {v};", self.r(dst[0]))
                } else {
                    let n = dst.len();
                    let mut s = format!(
                        "{{ tsr_{tn}x{n} v = *({}tsr_{tn}x{n} *)({at});",
                        qual(*space)
                    );
                    for (j, d) in dst.iter().enumerate() {
                        let v = from_mem(&format!("v[{j}]"), *mem, self.ty(*d));
                        let _ = write!(s, " {} = {v};", self.r(*d));
                    }
                    s.push_str(" }");
                    s
                };
                self.guarded(pred, s)
            }
            Inst::St {
                // The `.cs` hint is PTX's; HIP's accesses stay plain.
                stream: _,
                space,
                mem,
                src,
                addr,
                offset,
                pred,
            } => {
                let (tn, _) = mem_c(*mem);
                let at = self.address(*space, *addr, *offset);
                let vals: Vec<String> = src.iter().map(|s| self.to_mem(*s, *mem)).collect();
                let s = if src.len() == 1 {
                    format!("*({}tsr_{tn} *)({at}) = {};", qual(*space), vals[0])
                } else {
                    let n = src.len();
                    format!(
                        "{{ tsr_{tn}x{n} v = {{{}}}; *({}tsr_{tn}x{n} *)({at}) = v; }}",
                        vals.join(", "),
                        qual(*space)
                    )
                };
                self.guarded(pred, s)
            }
            Inst::AtomAdd {
                mem,
                src,
                addr,
                offset,
                pred,
            } => {
                let (c, v) = match mem {
                    MemTy::F32 => ("float", self.o(*src, RegTy::F32)),
                    MemTy::F64 => ("double", self.o(*src, RegTy::F64)),
                    MemTy::U32 => ("unsigned", self.o(*src, RegTy::U32)),
                    // Two's complement: an unsigned add is the signed one.
                    MemTy::I64 => ("unsigned long long", self.o(*src, RegTy::U64)),
                    MemTy::F16 => (
                        "_Float16",
                        format!("__builtin_bit_cast(_Float16, {})", self.o(*src, RegTy::B16)),
                    ),
                    MemTy::I32 => ("int", self.o(*src, RegTy::I32)),
                    m => return self.inexpressible(format!("an atomic add of {}", m.name())),
                };
                let at = self.address(Space::Global, *addr, *offset);
                let s = format!(
                    "__hip_atomic_fetch_add((TSR_GLOBAL {c} *)({at}), {v}, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);"
                );
                self.guarded(pred, s)
            }
            Inst::Barrier => {
                // `__syncthreads()`: shared-memory writes before it are seen after it.
                self.line(
                    depth,
                    "__builtin_amdgcn_fence(__ATOMIC_RELEASE, \"workgroup\");",
                );
                self.line(depth, "__builtin_amdgcn_s_barrier();");
                "__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, \"workgroup\");".to_string()
            }
            Inst::Trap { pred } => format!("if ({}) __builtin_trap();", self.r(*pred)),
            Inst::CpAsync { .. } | Inst::CpAsyncCommit | Inst::CpAsyncWait { .. } => {
                return self.inexpressible("an asynchronous copy (`cp.async`, NVIDIA's)")
            }
            Inst::LdMatrix { .. } => {
                return self.inexpressible("a warp matrix load (`ldmatrix`, NVIDIA's)")
            }
            Inst::Wgmma { .. }
            | Inst::WgmmaFence
            | Inst::WgmmaCommit
            | Inst::WgmmaWait { .. }
            | Inst::FenceProxyAsync => {
                return self.inexpressible("a warpgroup matrix multiply (`wgmma`, sm_90a's)")
            }
            Inst::TensorMapAddr { .. }
            | Inst::MbarInit { .. }
            | Inst::FenceMbarInit
            | Inst::MbarExpectTx { .. }
            | Inst::MbarArrive { .. }
            | Inst::MbarInval { .. }
            | Inst::PrefetchTensorMap { .. }
            | Inst::MbarWait { .. }
            | Inst::TmaLoad { .. }
            | Inst::TmaStore { .. }
            | Inst::BulkCommit
            | Inst::BulkWaitRead { .. } => {
                return self.inexpressible("a TMA copy or transaction barrier (sm_90a's)")
            }
            Inst::PackBf16 { .. } => {
                return self.inexpressible("a bf16 pair conversion (`cvt.rn.bf16x2.f32`, NVIDIA's)")
            }
            Inst::Mma { .. } => {
                let lines = matrix::print(self, i)?;
                for l in lines {
                    self.line(depth, &l);
                }
                return Ok(());
            }
            Inst::ShflXor {
                dst,
                src,
                lane_mask,
            } => self.shuffle(*dst, *src, *lane_mask),
            Inst::For {
                iv,
                lo,
                hi,
                step,
                body,
            } => {
                let t = self.ty(*iv);
                // Signed bounds, as the PTX loop compares (`s32`/`s64`).
                let st = if bits_of(t) == 64 {
                    RegTy::I64
                } else {
                    RegTy::I32
                };
                let ivn = self.r(*iv).to_string();
                let ivs = self.cast(*iv, st);
                let hi_s = self.o(*hi, st);
                let cond = match step {
                    Operand::Int(s) if *s > 0 => format!("{ivs} < {hi_s}"),
                    Operand::Int(_) => format!("{ivs} > {hi_s}"),
                    _ => {
                        let s = self.o(*step, st);
                        format!("({s} > 0 ? {ivs} < {hi_s} : {ivs} > {hi_s})")
                    }
                };
                let next = self.arith("+", t, Operand::Reg(*iv), *step);
                self.line(
                    depth,
                    &format!(
                        "for ({ivn} = {}; {cond}; {ivn} = {next}) {{",
                        self.o(*lo, t)
                    ),
                );
                self.block(body, depth + 1)?;
                self.line(depth, "}");
                return Ok(());
            }
            Inst::While { cond, pred, body } => {
                self.line(depth, "while (true) {");
                self.block(cond, depth + 1)?;
                let p = self.r(*pred).to_string();
                self.line(depth + 1, &format!("if (!{p}) break;"));
                self.block(body, depth + 1)?;
                self.line(depth, "}");
                return Ok(());
            }
            Inst::If {
                cond,
                then,
                otherwise,
            } => {
                let c = self.r(*cond).to_string();
                self.line(depth, &format!("if ({c}) {{"));
                self.block(then, depth + 1)?;
                if !otherwise.is_empty() {
                    self.line(depth, "} else {");
                    self.block(otherwise, depth + 1)?;
                }
                self.line(depth, "}");
                return Ok(());
            }
        };
        self.line(depth, &s);
        Ok(())
    }

    fn guarded(&self, pred: &Option<Reg>, s: String) -> String {
        match pred {
            Some(p) => format!("if ({}) {s}", self.r(*p)),
            None => s,
        }
    }

    /// The address expression of an access: a global address (a 64-bit
    /// integer) or an offset in the shared arena.
    fn address(&self, space: Space, addr: Reg, offset: i64) -> String {
        let off = match offset {
            0 => String::new(),
            o if o > 0 => format!(" + {o}"),
            o => format!(" - {}", -o),
        };
        match space {
            Space::Global => format!("{}{off}", self.cast(addr, RegTy::U64)),
            Space::Shared => format!("tsr_smem + {}{off}", self.cast(addr, RegTy::U32)),
        }
    }

    /// Operand `o` as a value of memory type `m` (the `St` conventions: a
    /// float register into a float or, bit-cast, into an integer of its width;
    /// an integer truncated to the element).
    fn to_mem(&self, o: Operand, m: MemTy) -> String {
        let c = mem_c(m).1;
        match o {
            Operand::Reg(r) if cty(self.ty(r)) == c => self.r(r).to_string(),
            Operand::Reg(r) => {
                let rt = self.ty(r);
                let mem_float = matches!(m, MemTy::F32 | MemTy::F64);
                let mem_bits = m.bytes() * 8;
                if rt.is_float() != mem_float && bits_of(rt) == mem_bits {
                    format!("__builtin_bit_cast({c}, {})", self.r(r))
                } else if rt.is_float() && !mem_float {
                    // A float register into a narrower integer: its bits.
                    let ut = if bits_of(rt) == 64 {
                        RegTy::U64
                    } else {
                        RegTy::U32
                    };
                    format!("({c}){}", self.cast(r, ut))
                } else {
                    format!("({c}){}", self.r(r))
                }
            }
            o => format!("({c}){}", self.o(o, store_ty(m))),
        }
    }

    fn binary(&self, op: BinOp, t: RegTy, a: Operand, b: Operand) -> R<String> {
        let (x, y) = (self.o(a, t), self.o(b, t));
        let float = t.is_float();
        let pred = t == RegTy::Pred;
        let n = int_name(t);
        let imm_shift = match b {
            Operand::Int(s) => (0..bits_of(t) as i64).contains(&s),
            _ => false,
        };
        Ok(match op {
            BinOp::Add if !pred => self.arith("+", t, a, b),
            BinOp::Sub if !pred => self.arith("-", t, a, b),
            BinOp::Mul if !pred => self.arith("*", t, a, b),
            BinOp::Div if float => format!("{x} / {y}"),
            BinOp::Div if !pred => format!("tsr_div_{n}({x}, {y})"),
            BinOp::Rem if !float && !pred => format!("tsr_rem_{n}({x}, {y})"),
            BinOp::Min if t == RegTy::F32 => format!("__builtin_fminf({x}, {y})"),
            BinOp::Max if t == RegTy::F32 => format!("__builtin_fmaxf({x}, {y})"),
            BinOp::Min if t == RegTy::F64 => format!("__builtin_fmin({x}, {y})"),
            BinOp::Max if t == RegTy::F64 => format!("__builtin_fmax({x}, {y})"),
            BinOp::Min if pred => format!("{x} && {y}"),
            BinOp::Max if pred => format!("{x} || {y}"),
            BinOp::Min => format!("{x} < {y} ? {x} : {y}"),
            BinOp::Max => format!("{x} > {y} ? {x} : {y}"),
            BinOp::And if pred => format!("{x} && {y}"),
            BinOp::Or if pred => format!("{x} || {y}"),
            BinOp::Xor if pred => format!("{x} != {y}"),
            BinOp::And if !float => format!("{x} & {y}"),
            BinOp::Or if !float => format!("{x} | {y}"),
            BinOp::Xor if !float => format!("{x} ^ {y}"),
            BinOp::Shl if !float && !pred && imm_shift => {
                let u = unsigned_of(t);
                format!("({})(({u}){x} << {y})", cty(t))
            }
            BinOp::Shr if !float && !pred && imm_shift => format!("{x} >> {y}"),
            BinOp::Shl if !float && !pred => format!("tsr_shl_{n}({x}, {y})"),
            BinOp::Shr if !float && !pred => format!("tsr_shr_{n}({x}, {y})"),
            op => return self.inexpressible(format!("`{op:?}` on {}", t.name())),
        })
    }

    fn cvt(&self, dst: Reg, src: Reg, narrow: Option<MemTy>) -> String {
        let (td, ts) = (self.ty(dst), self.ty(src));
        let (d, s) = (self.r(dst), self.r(src));
        match conversion(td, ts, narrow) {
            Conversion::Tf32 => return format!("{d} = tsr_tf32({s});"),
            Conversion::Narrow { bits, signed } => {
                let (via, to) = match (bits, signed) {
                    (8, true) => ("signed char", "int"),
                    (_, true) => ("short", "int"),
                    (16, false) => ("unsigned short", "unsigned"),
                    _ => ("unsigned char", "unsigned"),
                };
                return format!("{d} = ({})({to})({via}){s};", cty(td));
            }
            Conversion::Same => return format!("{d} = {s};"),
            Conversion::Other => {}
        }
        let half = |x: &str| format!("__builtin_bit_cast(_Float16, {x})");
        let v = match (td, ts) {
            (RegTy::F32 | RegTy::F64, RegTy::B16) => format!("({}){}", cty(td), half(s)),
            (RegTy::B16, _) => {
                format!("__builtin_bit_cast(unsigned short, (_Float16){s})")
            }
            (_, RegTy::B16) => {
                format!("tsr_cvt_{}_f32((float){})", int_name(td), half(s))
            }
            (RegTy::F32 | RegTy::F64, _) => format!("({}){s}", cty(td)),
            (_, RegTy::F32 | RegTy::F64) => {
                format!("tsr_cvt_{}_{}({s})", int_name(td), int_name(ts))
            }
            // Integer to integer: C's conversion (extension by the source's
            // signedness, truncation), as `cvt` does.
            _ => format!("({}){s}", cty(td)),
        };
        format!("{d} = {v};")
    }

    /// `dst` = `src` of lane `lane ^ mask`: a `ds_swizzle` within each
    /// 32-lane half (bit mode: and 0x1f, xor `mask`), or `ds_bpermute` across
    /// the halves of a 64-lane wave; 64-bit values move as two halves.
    fn shuffle(&self, dst: Reg, src: Reg, mask: u32) -> String {
        let wave = self.k.arch.info().warp_size;
        let swap = |x: &str| {
            if mask < 32 {
                format!(
                    "__builtin_amdgcn_ds_swizzle({x}, 0x{:04x})",
                    (mask << 10) | 0x1f
                )
            } else {
                format!(
                    "__builtin_amdgcn_ds_bpermute((int)((__builtin_amdgcn_workitem_id_x() & {}u) ^ {mask}u) << 2, {x})",
                    wave - 1
                )
            }
        };
        let t = self.ty(src);
        let (d, s) = (self.r(dst), self.r(src));
        if bits_of(t) == 64 {
            let u = if t == RegTy::U64 {
                s.to_string()
            } else if t == RegTy::F64 {
                format!("__builtin_bit_cast(unsigned long long, {s})")
            } else {
                format!("(unsigned long long){s}")
            };
            let lo = swap("(int)(unsigned)u");
            let hi = swap("(int)(unsigned)(u >> 32)");
            let back = match self.ty(dst) {
                RegTy::F64 => "__builtin_bit_cast(double, w)".to_string(),
                t => format!("({})w", cty(t)),
            };
            return format!(
                "{{ unsigned long long u = {u}; unsigned long long w = (unsigned long long)(unsigned){hi} << 32 | (unsigned){lo}; {d} = {back}; }}"
            );
        }
        let as_int = match t {
            RegTy::F32 => format!("__builtin_bit_cast(int, {s})"),
            _ => format!("(int){s}"),
        };
        let moved = swap(&as_int);
        let back = match self.ty(dst) {
            RegTy::F32 => format!("__builtin_bit_cast(float, {moved})"),
            t => format!("({}){moved}", cty(t)),
        };
        format!("{d} = {back};")
    }
}

/// The `may_alias` pointer qualifier of a space (shared memory is the
/// `tsr_smem` array: clang infers its address space).
fn qual(space: Space) -> &'static str {
    match space {
        Space::Global => "TSR_GLOBAL ",
        Space::Shared => "",
    }
}

/// An element of memory type `m` read as a register of type `t` (the `Ld`
/// conventions: extension by the element's signedness, bit casts between an
/// integer and a float of one width).
fn from_mem(v: &str, m: MemTy, t: RegTy) -> String {
    let mem_float = matches!(m, MemTy::F32 | MemTy::F64);
    if mem_c(m).1 == cty(t) {
        v.to_string()
    } else if t.is_float() != mem_float && bits_of(t) == m.bytes() * 8 {
        format!("__builtin_bit_cast({}, {v})", cty(t))
    } else if t == RegTy::Pred {
        format!("{v} != 0")
    } else {
        format!("({}){v}", cty(t))
    }
}

#[cfg(test)]
pub(crate) mod tests;
