//! `x + dot(a, b)` becomes `dot(a, b, x)`: the matrix instructions then
//! accumulate onto `x` in place, instead of the dot's zeros, with the sum
//! after. Flash attention's `acc * alpha + dot(p, v)` kept both `[BM, D]`
//! tiles live at once (255 registers and 440 bytes of spills at D = 128
//! on sm_90) until this rule. Triton's combine pass does the same. The
//! rounding differs only in where `x` enters the f32 sum.

use std::collections::HashMap;

use super::{BinaryOp, Kernel, OpKind, Region, Type, Value};

impl Kernel {
    /// Folds each `add` of a dot without accumulator (its only use) and a
    /// value of the dot's type into the dot, in every region.
    pub fn fuse_dot_accumulators(&mut self) {
        let mut uses = HashMap::new();
        count(&self.body, &mut uses);
        fuse(&mut self.body, &uses, &self.types);
    }
}

/// How many times each value is read in `r` (as dead-code removal counts,
/// but not charged to the lowering's work: this pass is one linear sweep).
fn count(r: &Region, uses: &mut HashMap<Value, u32>) {
    for op in &r.ops {
        for v in op.kind.operands() {
            *uses.entry(v).or_default() += 1;
        }
        for sub in op.kind.regions() {
            count(sub, uses);
        }
    }
}

fn fuse(r: &mut Region, uses: &HashMap<Value, u32>, types: &[Type]) {
    let ty = |v: Value| &types[v.0 as usize];
    // Where each dot without accumulator of this region is (by result).
    let mut dots: HashMap<Value, usize> = HashMap::new();
    let mut drop = vec![false; r.ops.len()];
    for i in 0..r.ops.len() {
        match &r.ops[i].kind {
            OpKind::Dot { acc: None, .. } => {
                dots.insert(r.ops[i].results[0], i);
            }
            OpKind::Binary {
                op: BinaryOp::Add,
                a,
                b,
            } => {
                let res = r.ops[i].results[0];
                let pick = [(*a, *b), (*b, *a)].into_iter().find(|&(d, x)| {
                    dots.contains_key(&d)
                        && uses.get(&d) == Some(&1)
                        && x != d
                        && ty(x) == ty(d)
                        && ty(res) == ty(d)
                });
                if let Some((d, x)) = pick {
                    let j = dots.remove(&d).expect("a dot of this region");
                    let OpKind::Dot {
                        a, b, precision, ..
                    } = r.ops[j].kind.clone()
                    else {
                        unreachable!("dots holds dots")
                    };
                    r.ops[i].kind = OpKind::Dot {
                        a,
                        b,
                        acc: Some(x),
                        precision,
                    };
                    drop[j] = true;
                }
            }
            _ => {}
        }
    }
    let mut k = drop.iter();
    r.ops.retain(|_| !k.next().copied().unwrap_or(false));
    for op in &mut r.ops {
        for sub in op.kind.regions_mut() {
            fuse(sub, uses, types);
        }
    }
}
