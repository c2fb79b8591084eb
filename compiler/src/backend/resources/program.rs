//! The structured program of a Target IR kernel for the register estimate:
//! rematerialised values, the modelled orders of its blocks, and the
//! registers of ptxas's slow-path subroutines.

use super::order::{hoist_loads, ilp_order, sink};
use super::unroll::unroll_short_loops;
use super::{work, Node};
use crate::target::ptxas::{SLOW_DIV_REGS, SLOW_SQRT_REGS};

/// Registers whose value ptxas re-creates wherever it is needed instead of
/// holding it: special registers (thread and block ids, re-read with `S2R`
/// next to each use rather than kept live across a loop or a long stretch of
/// code) and shared-memory buffer addresses (immediates). Only
/// single-definition registers qualify. Kernel parameters are too, inside
/// loops only, on archs where ptxas reads them from the constant bank there
/// (see the module docs).
pub(super) struct Remat {
    /// Per register: whether it is rematerialised.
    pub(super) remat: Vec<bool>,
    /// Words of every register, the fresh ones (one per use) included.
    pub(super) words: Vec<u32>,
    /// Per register, the kernel's register it copies (itself for the
    /// kernel's own; `u32::MAX` for a slow path's scratch registers).
    pub(super) origin: Vec<u32>,
    /// The types of the kernel's registers (and of the fresh ones).
    pub(super) tys: Vec<crate::ir::target::RegTy>,
    /// Per register of the kernel: how many instructions write it.
    pub(super) def_count: Vec<u32>,
    /// Registers written once, by a move of an integer immediate.
    pub(super) consts: std::collections::HashMap<u32, i64>,
    /// The most trips of a loop ptxas unrolls completely on the kernel's arch.
    pub(super) max_unroll_trips: u32,
    /// Whether loops of run-time trip counts are unrolled by 4 (ptxas; not
    /// LLVM's AMDGPU target): see `unroll::unrolled_by_four`.
    pub(super) runtime_unroll: bool,
    /// Per register: whether it is a kernel parameter (written once) that
    /// ptxas reads from the constant bank inside loops on the kernel's arch
    /// (see [`crate::target::ptxas::PtxasModel::loop_params_from_constant_bank`]).
    pub(super) bank_param: Vec<bool>,
    /// How many loops enclose the instructions being converted.
    pub(super) loop_depth: u32,
    /// Whether loads are issued early ([`hoist_loads`]).
    pub(super) hoist: bool,
    /// Of a stretch's `ldmatrix` fragments, those of how many k steps are
    /// issued early ([`Hoist`]).
    pub(super) ldmatrix_steps: u32,
    /// Of a stretch's MMA operand fragments loaded from shared memory by
    /// plain loads, those of how many k steps are issued early ([`Hoist`]).
    pub(super) shared_steps: u32,
    /// The most loaded words a stretch issues early ([`hoist_loads`]).
    pub(super) load_window: u32,
    /// Whether pure instructions sink along chains ([`sink`]'s `chains`).
    pub(super) chains: bool,
    /// Whether blocks run in [`ilp_order`] instead.
    pub(super) ilp: bool,
    /// Whether indices read only by compares follow them ([`sink`]'s
    /// `compares`).
    pub(super) compares: bool,
    /// The vendor of the kernel's arch (whose expansion of division and
    /// square root [`slow_path_scratch`] counts).
    pub(super) vendor: crate::target::Vendor,
}

impl Remat {
    pub(super) fn new(kernel: &crate::ir::target::Kernel) -> Self {
        use crate::ir::target::Inst;
        use crate::ir::target::Operand;
        fn walk(
            insts: &[Inst],
            defs: &mut [u32],
            cheap: &mut [bool],
            imm: &mut std::collections::HashMap<u32, i64>,
            param: &mut [bool],
        ) {
            for i in insts {
                for r in i.defs() {
                    defs[r.0 as usize] += 1;
                    if matches!(i, Inst::Special { .. } | Inst::SmemAddr { .. }) {
                        cheap[r.0 as usize] = true;
                    }
                    if matches!(i, Inst::Param { .. }) {
                        param[r.0 as usize] = true;
                    }
                }
                if let Inst::Mov {
                    dst,
                    src: Operand::Int(v),
                } = i
                {
                    imm.insert(dst.0, *v);
                }
                for region in i.regions() {
                    walk(region, defs, cheap, imm, param);
                }
            }
        }
        let n = kernel.regs.len();
        let mut defs = vec![0; n];
        let mut cheap = vec![false; n];
        let mut imm = std::collections::HashMap::new();
        let mut param = vec![false; n];
        walk(&kernel.body, &mut defs, &mut cheap, &mut imm, &mut param);
        imm.retain(|r, _| defs[*r as usize] == 1);
        let bank = kernel.arch.ptxas().loop_params_from_constant_bank;
        Remat {
            remat: (0..n).map(|r| cheap[r] && defs[r] == 1).collect(),
            bank_param: (0..n).map(|r| bank && param[r] && defs[r] == 1).collect(),
            words: kernel.regs.iter().map(|t| t.words()).collect(),
            origin: (0..n as u32).collect(),
            tys: kernel.regs.clone(),
            def_count: defs,
            consts: imm,
            max_unroll_trips: kernel.arch.ptxas().full_unroll_max_trips,
            runtime_unroll: kernel.arch.info().vendor == crate::target::Vendor::Nvidia,
            loop_depth: 0,
            hoist: true,
            ldmatrix_steps: u32::MAX,
            shared_steps: 0,
            load_window: match kernel.arch.info().vendor {
                crate::target::Vendor::Nvidia => crate::target::ptxas::LOAD_WINDOW_WORDS,
                crate::target::Vendor::Amd => crate::target::amdgpu::LOAD_WINDOW_WORDS,
            },
            chains: false,
            ilp: false,
            compares: false,
            vendor: kernel.arch.info().vendor,
        }
    }

    /// A new register of `r`'s type.
    pub(super) fn fresh_like(&mut self, r: u32) -> u32 {
        self.tys.push(self.tys[r as usize]);
        let fresh = self.fresh(self.words[r as usize]);
        self.origin[fresh as usize] = self.origin[r as usize];
        fresh
    }

    pub(super) fn is_remat(&self, r: u32) -> bool {
        self.remat.get(r as usize).copied().unwrap_or(false)
    }

    /// A new register of `words` words.
    fn fresh(&mut self, words: u32) -> u32 {
        self.words.push(words);
        self.origin.push(u32::MAX);
        self.words.len() as u32 - 1
    }

    /// Whether a use of `r` here reads a copy made for it rather than `r`
    /// itself: `r` is rematerialised, or is a parameter read from the
    /// constant bank inside a loop.
    fn fresh_at_use(&self, r: u32) -> bool {
        self.is_remat(r)
            || (self.loop_depth > 0 && self.bank_param.get(r as usize).copied().unwrap_or(false))
    }

    /// `uses` with every register read from a copy ([`Remat::fresh_at_use`])
    /// replaced by a fresh one that `out` defines right before (live only up
    /// to this use).
    fn uses(&mut self, uses: Vec<u32>, out: &mut Vec<Node>) -> Vec<u32> {
        uses.into_iter()
            .map(|r| {
                if !self.fresh_at_use(r) {
                    return r;
                }
                let fresh = self.words.len() as u32;
                self.words.push(self.words[r as usize]);
                self.origin.push(self.origin[r as usize]);
                out.push(Node::Inst {
                    defs: vec![fresh],
                    uses: vec![],
                });
                fresh
            })
            .collect()
    }
}

/// The structured program of a Target IR kernel, for [`max_pressure`], and the
/// width in words of each of its registers. A `For`
/// loop's entry writes the induction variable from its bounds; the increment
/// and the test at the end of every iteration read it with the bound and step,
/// so registers holding those stay live through the loop. A `While` loop
/// repeats its condition, the test of its predicate (where it is left), and its
/// body. Each block is first put in [`hoist_loads`] and [`sink`] order. Thread/block ids and shared
/// buffer addresses are not held: each use reads a fresh copy defined right
/// before it (see `Remat`).
pub fn program_of(kernel: &crate::ir::target::Kernel) -> (Vec<Node>, Vec<u32>) {
    program_with(kernel, Hoist::All, false, false, false)
}

/// How early loads are issued ([`hoist_loads`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hoist {
    /// Where Target IR puts them.
    No,
    /// Early, with the `ldmatrix` fragments of every k step of a stretch's
    /// MMAs before the first one.
    All,
    /// Early, but of the fragments only the first k step's: ptxas's order
    /// where registers run short (see `of_target`).
    OneKStep,
    /// As `All`, and the MMA operand fragments a stretch reads from shared
    /// memory with plain loads (AMD's LDS reads; ptxas's `ldmatrix` has its
    /// own) of its first so many k steps with them: LLVM's order where the
    /// occupancy leaves VGPRs free (see `amd::of_target`).
    SharedSteps(u32),
}

/// [`program_of`], with loads issued early (`hoist`) or left where Target IR
/// puts them.
pub(super) fn program_with(
    kernel: &crate::ir::target::Kernel,
    hoist: Hoist,
    chains: bool,
    ilp: bool,
    compares: bool,
) -> (Vec<Node>, Vec<u32>) {
    let (program, words, _) = program_with_origin(kernel, hoist, chains, ilp, compares);
    (program, words)
}

/// [`program_with`], and per register of the program the kernel's register
/// it copies (`u32::MAX` for none: a slow path's scratch).
pub(super) fn program_with_origin(
    kernel: &crate::ir::target::Kernel,
    hoist: Hoist,
    chains: bool,
    ilp: bool,
    compares: bool,
) -> (Vec<Node>, Vec<u32>, Vec<u32>) {
    fn convert(insts: &[crate::ir::target::Inst], rm: &mut Remat) -> Vec<Node> {
        use crate::ir::target::Inst;
        let mut out = Vec::with_capacity(insts.len());
        let insts = unroll_short_loops(insts, rm);
        let order = if rm.ilp {
            ilp_order(&insts)
        } else if rm.hoist {
            sink(
                &hoist_loads(&insts, rm.load_window, rm.ldmatrix_steps, rm.shared_steps),
                &rm.tys,
                rm.chains,
                rm.compares,
                rm.vendor == crate::target::Vendor::Nvidia,
            )
        } else {
            sink(
                &insts.iter().collect::<Vec<_>>(),
                &rm.tys,
                rm.chains,
                rm.compares,
                rm.vendor == crate::target::Vendor::Nvidia,
            )
        };
        for inst in order {
            crate::cancel::checkpoint();
            work(1);
            let regs =
                |v: Vec<crate::ir::target::Reg>| v.into_iter().map(|r| r.0).collect::<Vec<_>>();
            if inst.defs().iter().any(|r| rm.is_remat(r.0)) {
                continue;
            }
            match inst {
                Inst::Comment(_) => {}
                Inst::For { iv, body, .. } => {
                    let bounds = regs(inst.uses());
                    rm.loop_depth += 1;
                    let mut b = convert(body, rm);
                    let mut step_uses = rm.uses(bounds.clone(), &mut b);
                    rm.loop_depth -= 1;
                    step_uses.push(iv.0);
                    b.push(Node::Inst {
                        defs: vec![iv.0],
                        uses: step_uses.clone(),
                    });
                    b.push(Node::Test { uses: step_uses });
                    let entry_uses = rm.uses(bounds, &mut out);
                    out.push(Node::Loop {
                        entry: Box::new(Node::Inst {
                            defs: vec![iv.0],
                            uses: entry_uses,
                        }),
                        body: b,
                    });
                }
                Inst::While { cond, pred, body } => {
                    rm.loop_depth += 1;
                    let mut b = convert(cond, rm);
                    b.push(Node::Test { uses: vec![pred.0] });
                    b.extend(convert(body, rm));
                    rm.loop_depth -= 1;
                    out.push(Node::Loop {
                        entry: Box::new(Node::Inst {
                            defs: vec![],
                            uses: vec![],
                        }),
                        body: b,
                    });
                }
                Inst::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    let cond = rm.uses(vec![cond.0], &mut out);
                    let then = convert(then, rm);
                    let otherwise = convert(otherwise, rm);
                    out.push(Node::Branch {
                        cond,
                        then,
                        otherwise,
                    })
                }
                other => {
                    let uses = rm.uses(regs(other.uses()), &mut out);
                    let mut defs = regs(other.defs());
                    let scratch = slow_path_scratch(other, &rm.tys, rm.vendor);
                    if scratch > 0 {
                        // The subroutine's own registers: a value written
                        // here and never read.
                        defs.push(rm.fresh(scratch));
                    }
                    out.push(Node::Inst { defs, uses })
                }
            }
        }
        out
    }
    let mut rm = Remat::new(kernel);
    rm.hoist = hoist != Hoist::No;
    rm.ldmatrix_steps = match hoist {
        Hoist::OneKStep => 1,
        _ => u32::MAX,
    };
    rm.shared_steps = match hoist {
        Hoist::SharedSteps(n) => n,
        _ => 0,
    };
    rm.chains = chains;
    rm.ilp = ilp;
    rm.compares = compares;
    let program = convert(&kernel.body, &mut rm);
    (program, rm.words, rm.origin)
}

/// Registers that the subroutine behind `inst` needs beyond the values live
/// across it: ptxas expands IEEE-rounded f32 division and reciprocal
/// (`div.rn`, `rcp.rn`) and square root (`sqrt.rn`) into a fast path and a
/// called slow path, whose registers come on top of the caller's. Measured
/// with ptxas 12.9 on straight-line kernels holding 4 to 16 values across one
/// such instruction (`compiler/tests/ptxas.rs` re-checks it): 9 more
/// registers for a division or reciprocal, 4 for a square root, on sm_70,
/// sm_80 and sm_90 (sm_90 needs up to 2 fewer). LLVM's AMDGPU backend
/// expands them inline instead ([`crate::target::amdgpu::DIV_SCRATCH_VGPRS`]).
pub(super) fn slow_path_scratch(
    inst: &crate::ir::target::Inst,
    tys: &[crate::ir::target::RegTy],
    vendor: crate::target::Vendor,
) -> u32 {
    use crate::ir::target::{BinOp, Inst, RegTy, UnOp};
    use crate::target::{amdgpu, Vendor};
    let f32_result = |r: &crate::ir::target::Reg| tys[r.0 as usize] == RegTy::F32;
    let (div, sqrt) = match vendor {
        Vendor::Nvidia => (SLOW_DIV_REGS, SLOW_SQRT_REGS),
        Vendor::Amd => (amdgpu::DIV_SCRATCH_VGPRS, amdgpu::SQRT_SCRATCH_VGPRS),
    };
    match inst {
        Inst::Binary {
            op: BinOp::Div,
            dst,
            ..
        }
        | Inst::Unary {
            op: UnOp::Rcp, dst, ..
        } if f32_result(dst) => div,
        Inst::Unary {
            op: UnOp::Sqrt,
            dst,
            ..
        } if f32_result(dst) => sqrt,
        _ => 0,
    }
}
