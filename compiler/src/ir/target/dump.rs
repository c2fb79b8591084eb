//! The textual dump of Target IR (`tsrc emit --emit target-ir`).

use std::fmt::{self, Write};

use super::{BinOp, CmpOp, Inst, Kernel, Operand, Reg, RegTy, Special, UnOp, WgmmaA};
use crate::target::MmaKind;

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "kernel {} arch={} threads={} smem={}B",
            self.name,
            self.arch,
            self.num_threads,
            self.smem_bytes()
        )?;
        for (i, p) in self.params.iter().enumerate() {
            writeln!(f, "  param {i} {}: {}", p.name, p.ty.name())?;
        }
        for (i, m) in self.tensor_maps.iter().enumerate() {
            let dims: Vec<String> = m.box_dims.iter().map(|d| d.to_string()).collect();
            writeln!(
                f,
                "  tensor_map {i} of {}: box [{}] (innermost first), swizzle {}B",
                m.name,
                dims.join(", "),
                m.swizzle
            )?;
        }
        for (i, b) in self.smem.iter().enumerate() {
            writeln!(
                f,
                "  smem {i} {}: {} bytes at {}{} ({})",
                b.name,
                b.bytes,
                b.offset,
                b.swizzle
                    .map(|s| format!(
                        ", swizzle row={}B per_phase={} max_phase={}{}{}",
                        s.row_bytes,
                        s.per_phase,
                        s.max_phase,
                        match s.panel_rows {
                            0 => String::new(),
                            r => format!(" panels of {r} rows"),
                        },
                        match s.warpgroup_tiles {
                            0 | 1 => String::new(),
                            t => format!(" warpgroup order of {t} tiles"),
                        }
                    ))
                    .unwrap_or_default(),
                b.purpose
            )?;
        }
        for (v, l) in &self.layouts {
            writeln!(f, "  layout %{v}: {l}")?;
        }
        let mut out = String::new();
        block(self, &self.body, 1, &mut out);
        f.write_str(&out)
    }
}

fn r(k: &Kernel, x: Reg) -> String {
    reg_name(k.reg_ty(x), x.0)
}

/// The dump's name of register `n` of type `t` (`p7`, `f3`, `b2`, `r12`);
/// the HIP printer names its C locals so too.
pub(crate) fn reg_name(t: RegTy, n: u32) -> String {
    let prefix = match t {
        RegTy::Pred => "p",
        RegTy::F32 | RegTy::F64 => "f",
        RegTy::B16 | RegTy::B32 => "b",
        _ => "r",
    };
    format!("{prefix}{n}")
}

fn o(k: &Kernel, x: &Operand) -> String {
    match x {
        Operand::Reg(x) => r(k, *x),
        Operand::Int(i) => i.to_string(),
        Operand::Float(v) => format!("{v:?}"),
    }
}

fn d(k: &Kernel, x: Reg) -> String {
    format!("{}:{}", r(k, x), k.reg_ty(x).name())
}

fn pred(k: &Kernel, p: &Option<Reg>) -> String {
    match p {
        Some(p) => format!(" if {}", r(k, *p)),
        None => String::new(),
    }
}

fn block(k: &Kernel, insts: &[Inst], depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    for i in insts {
        let line = match i {
            Inst::Param { dst, index } => {
                format!("{} = param {}", d(k, *dst), k.params[*index].name)
            }
            Inst::Special { dst, which } => format!(
                "{} = {}",
                d(k, *dst),
                match which {
                    Special::ThreadId => "thread_id".to_string(),
                    Special::BlockId(a) => format!("block_id({a})"),
                    Special::NumBlocks(a) => format!("num_blocks({a})"),
                }
            ),
            Inst::SmemAddr { dst, buffer } => {
                format!("{} = smem_addr {}", d(k, *dst), k.smem[*buffer].name)
            }
            Inst::Mov { dst, src } => format!("{} = {}", d(k, *dst), o(k, src)),
            Inst::Unary { op, dst, x } => {
                format!("{} = {} {}", d(k, *dst), un_name(*op), o(k, x))
            }
            Inst::Binary { op, dst, a, b } => format!(
                "{} = {} {}, {}",
                d(k, *dst),
                bin_name(*op),
                o(k, a),
                o(k, b)
            ),
            Inst::Fma { dst, a, b, c } => {
                format!("{} = fma {}, {}, {}", d(k, *dst), o(k, a), o(k, b), o(k, c))
            }
            Inst::MulWide { dst, a, b } => {
                format!("{} = mul_wide {}, {}", d(k, *dst), o(k, a), o(k, b))
            }
            Inst::PackBf16 { dst, hi, lo } => {
                format!("{} = pack_bf16 {}, {}", d(k, *dst), o(k, hi), o(k, lo))
            }
            Inst::Cmp { op, ty, dst, a, b } => format!(
                "{} = cmp.{}.{} {}, {}",
                d(k, *dst),
                cmp_name(*op),
                ty.name(),
                o(k, a),
                o(k, b)
            ),
            Inst::Select { dst, cond, a, b } => format!(
                "{} = select {}, {}, {}",
                d(k, *dst),
                r(k, *cond),
                o(k, a),
                o(k, b)
            ),
            Inst::Cvt { dst, src, narrow } => format!(
                "{} = cvt {}{}",
                d(k, *dst),
                r(k, *src),
                narrow
                    .map(|m| format!(" narrow {}", m.name()))
                    .unwrap_or_default()
            ),
            Inst::Ld {
                stream,
                space,
                mem,
                dst,
                addr,
                offset,
                pred: p,
            } => format!(
                "{} = ld.{}{}.{}{} [{} + {}]{}",
                dst.iter().map(|x| d(k, *x)).collect::<Vec<_>>().join(", "),
                space.name(),
                if *stream { ".stream" } else { "" },
                mem.name(),
                vec_suffix(dst.len()),
                r(k, *addr),
                offset,
                pred(k, p)
            ),
            Inst::St {
                stream,
                space,
                mem,
                src,
                addr,
                offset,
                pred: p,
            } => format!(
                "st.{}{}.{}{} [{} + {}], {}{}",
                space.name(),
                if *stream { ".stream" } else { "" },
                mem.name(),
                vec_suffix(src.len()),
                r(k, *addr),
                offset,
                src.iter().map(|x| o(k, x)).collect::<Vec<_>>().join(", "),
                pred(k, p)
            ),
            Inst::AtomAdd {
                mem,
                src,
                addr,
                offset,
                pred: p,
            } => format!(
                "atomic_add.global.{} [{} + {}], {}{}",
                mem.name(),
                r(k, *addr),
                offset,
                o(k, src),
                pred(k, p)
            ),
            Inst::Barrier => "barrier".to_string(),
            Inst::Trap { pred } => format!("trap if {}", r(k, *pred)),
            Inst::CpAsync {
                dst,
                dst_offset,
                src,
                src_offset,
                bytes,
                src_size,
            } => format!(
                "copy_async.{bytes} [{}{}] <- [{} + {}]{}",
                r(k, *dst),
                match dst_offset {
                    0 => String::new(),
                    o => format!(" + {o}"),
                },
                r(k, *src),
                src_offset,
                src_size
                    .map(|s| format!(" size {}", r(k, s)))
                    .unwrap_or_default()
            ),
            Inst::CpAsyncCommit => "copy_async_commit".to_string(),
            Inst::Wgmma {
                n,
                input,
                acc,
                a,
                b_desc,
                trans_b,
                accumulate,
            } => format!(
                "wgmma.m64n{n}k{}.{}{} [{}] {} {} x desc {}",
                32 / input.bytes(),
                input.name(),
                if *trans_b { ".trans_b" } else { "" },
                acc.iter().map(|x| r(k, *x)).collect::<Vec<_>>().join(", "),
                if *accumulate { "+=" } else { "=" },
                match a {
                    WgmmaA::Desc(d) => format!("desc {}", r(k, *d)),
                    WgmmaA::Regs(rs) => format!(
                        "[{}]",
                        rs.iter().map(|x| r(k, *x)).collect::<Vec<_>>().join(", ")
                    ),
                },
                r(k, *b_desc)
            ),
            Inst::WgmmaFence => "wgmma_fence".to_string(),
            Inst::WgmmaCommit => "wgmma_commit".to_string(),
            Inst::WgmmaWait { pending } => format!("wgmma_wait {pending}"),
            Inst::FenceProxyAsync => "fence_proxy_async".to_string(),
            Inst::TensorMapAddr { dst, map } => format!("{} = tensor_map {map}", d(k, *dst)),
            Inst::MbarInit { bar, count } => format!("mbarrier_init [{}], {count}", r(k, *bar)),
            Inst::FenceMbarInit => "fence_mbarrier_init".to_string(),
            Inst::MbarExpectTx { bar, bytes } => {
                format!("mbarrier_arrive_expect_tx [{}], {bytes}", r(k, *bar))
            }
            Inst::MbarArrive { bar } => format!("mbarrier_arrive [{}]", r(k, *bar)),
            Inst::MbarInval { bar } => format!("mbarrier_inval [{}]", r(k, *bar)),
            Inst::PrefetchTensorMap { map } => format!("prefetch_tensor_map [{}]", r(k, *map)),
            Inst::MbarWait { bar, parity } => {
                format!("mbarrier_wait [{}], parity {}", r(k, *bar), o(k, parity))
            }
            Inst::TmaStore {
                src,
                src_offset,
                map,
                coords,
            } => format!(
                "tma_store map {} at ({}) <- [{}{}]",
                r(k, *map),
                coords
                    .iter()
                    .map(|c| o(k, c))
                    .collect::<Vec<_>>()
                    .join(", "),
                r(k, *src),
                match src_offset {
                    0 => String::new(),
                    o => format!(" + {o}"),
                },
            ),
            Inst::BulkCommit => "bulk_commit".to_string(),
            Inst::BulkWaitRead { pending } => format!("bulk_wait_read {pending}"),
            Inst::TmaLoad {
                dst,
                dst_offset,
                map,
                coords,
                bar,
            } => format!(
                "tma_load [{}{}] <- map {} at ({}), mbarrier [{}]",
                r(k, *dst),
                match dst_offset {
                    0 => String::new(),
                    o => format!(" + {o}"),
                },
                r(k, *map),
                coords
                    .iter()
                    .map(|c| o(k, c))
                    .collect::<Vec<_>>()
                    .join(", "),
                r(k, *bar)
            ),
            Inst::CpAsyncWait { pending } => format!("copy_async_wait {pending}"),
            Inst::LdMatrix { dst, addr, trans } => format!(
                "{} = load_matrix{} [{}]",
                dst.iter().map(|x| d(k, *x)).collect::<Vec<_>>().join(", "),
                if *trans { ".trans" } else { "" },
                r(k, *addr)
            ),
            Inst::Mma {
                kind,
                m,
                n,
                k: kk,
                input,
                d: dd,
                a,
                b,
                c,
            } => {
                let list = |v: &[Reg]| v.iter().map(|x| r(k, *x)).collect::<Vec<_>>().join(", ");
                let op = match kind {
                    MmaKind::MmaSync => format!("mma.m{m}n{n}k{kk}"),
                    MmaKind::Mfma => format!("mfma.{m}x{n}x{kk}"),
                    MmaKind::Wmma => format!("wmma.{m}x{n}x{kk}"),
                };
                format!(
                    "{} = {op}.{} [{}] x [{}] + [{}]",
                    dd.iter().map(|x| d(k, *x)).collect::<Vec<_>>().join(", "),
                    input.name(),
                    list(a),
                    list(b),
                    list(c)
                )
            }
            Inst::ShflXor {
                dst,
                src,
                lane_mask,
            } => format!("{} = shfl_xor {}, {lane_mask}", d(k, *dst), r(k, *src)),
            Inst::Comment(c) => format!("// {c}"),
            Inst::For {
                iv,
                lo,
                hi,
                step,
                body,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}for {} in range({}, {}, {}) {{",
                    d(k, *iv),
                    o(k, lo),
                    o(k, hi),
                    o(k, step)
                );
                block(k, body, depth + 1, out);
                let _ = writeln!(out, "{pad}}}");
                continue;
            }
            Inst::While {
                cond,
                pred: p,
                body,
            } => {
                let _ = writeln!(out, "{pad}while {{");
                block(k, cond, depth + 1, out);
                let _ = writeln!(out, "{pad}}} {} {{", r(k, *p));
                block(k, body, depth + 1, out);
                let _ = writeln!(out, "{pad}}}");
                continue;
            }
            Inst::If {
                cond,
                then,
                otherwise,
            } => {
                let _ = writeln!(out, "{pad}if {} {{", r(k, *cond));
                block(k, then, depth + 1, out);
                let _ = writeln!(out, "{pad}}} else {{");
                block(k, otherwise, depth + 1, out);
                let _ = writeln!(out, "{pad}}}");
                continue;
            }
        };
        let _ = writeln!(out, "{pad}{line}");
    }
}

fn vec_suffix(n: usize) -> String {
    if n > 1 {
        format!(".v{n}")
    } else {
        String::new()
    }
}

pub(super) fn un_name(op: UnOp) -> &'static str {
    match op {
        UnOp::Neg => "neg",
        UnOp::Not => "not",
        UnOp::Abs => "abs",
        UnOp::Exp2Approx => "exp2_approx",
        UnOp::Exp2ApproxFtz => "exp2_approx_ftz",
        UnOp::Log2Approx => "log2_approx",
        UnOp::RsqrtApprox => "rsqrt_approx",
        UnOp::TanhApprox => "tanh_approx",
        UnOp::Sqrt => "sqrt",
        UnOp::Rcp => "rcp",
        UnOp::Floor => "floor",
    }
}

pub(super) fn bin_name(op: BinOp) -> &'static str {
    match op {
        BinOp::Add => "add",
        BinOp::Sub => "sub",
        BinOp::Mul => "mul",
        BinOp::Div => "div",
        BinOp::Rem => "rem",
        BinOp::Min => "min",
        BinOp::Max => "max",
        BinOp::And => "and",
        BinOp::Or => "or",
        BinOp::Xor => "xor",
        BinOp::Shl => "shl",
        BinOp::Shr => "shr",
    }
}

pub(super) fn cmp_name(op: CmpOp) -> &'static str {
    match op {
        CmpOp::Eq => "eq",
        CmpOp::Ne => "ne",
        CmpOp::Lt => "lt",
        CmpOp::Le => "le",
        CmpOp::Gt => "gt",
        CmpOp::Ge => "ge",
    }
}
