//! Control flow: a region of an `if`/`for`/`while` node lowers to its own
//! step list, its params bound to buffers or host scalars (slots), its results
//! copied into the node's slots.

use std::collections::HashMap;

use super::generate::Group;
use super::{BufId, Lower, ScalarExpr, Step, R};
use crate::ir::graph::{GType, Graph, NodeId, NodeKind, Region as GRegion};

/// Where a value crosses a region boundary: a buffer, or a host scalar (a
/// host variable where a region writes it).
#[derive(Clone, Debug)]
pub(super) enum Slot {
    Buf(BufId),
    Scalar(ScalarExpr),
}

/// The types of a region's outputs.
pub(super) fn region_types(r: &GRegion) -> Vec<GType> {
    r.graph
        .outputs
        .iter()
        .map(|o| r.graph.ty(*o).clone())
        .collect()
}

impl Lower<'_> {
    pub(super) fn fresh_var(&mut self, hint: &str) -> String {
        self.vars += 1;
        format!("{hint}{}", self.vars - 1)
    }

    /// A bool host scalar for a condition node.
    pub(super) fn host_condition(&self, cond: NodeId, user: NodeId) -> R<ScalarExpr> {
        if !self.g.ty(cond).is_scalar() {
            return Err(self.unsupported(user, "a condition read back from a tensor"));
        }
        self.scalar(cond)
    }

    /// Fresh places for results of these types: temporaries and host variables.
    pub(super) fn result_slots(&mut self, tys: &[GType], hint: &str) -> Vec<Slot> {
        tys.iter()
            .map(|t| match t {
                GType::Tensor { dims, dtype } => Slot::Buf(self.temp(dims.clone(), *dtype)),
                _ => Slot::Scalar(ScalarExpr::Var(self.fresh_var(hint))),
            })
            .collect()
    }

    /// The places of a loop's carried values, set to their initial values.
    pub(super) fn carried_slots(&mut self, init: &[NodeId]) -> R<Vec<Slot>> {
        let tys: Vec<GType> = init.iter().map(|i| self.g.ty(*i).clone()).collect();
        let slots = self.result_slots(&tys, "v");
        for (i, slot) in init.iter().zip(&slots) {
            match slot {
                Slot::Buf(b) => {
                    self.buf(*i, *i)?;
                    self.fused(
                        &Group {
                            members: vec![],
                            root: *i,
                            copy: true,
                        },
                        *b,
                    )?;
                }
                Slot::Scalar(ScalarExpr::Var(v)) => {
                    let value = self.scalar(*i)?;
                    self.steps.push(Step::SetVar {
                        var: v.clone(),
                        value,
                    });
                }
                Slot::Scalar(_) => {}
            }
        }
        Ok(slots)
    }

    /// Binds the `Project` nodes of a control-flow node to its result slots.
    pub(super) fn bind_results(&mut self, node: NodeId, slots: &[Slot]) {
        for u in self.consumers[node.0 as usize].clone() {
            if let NodeKind::Project { index, .. } = self.g.node(u).kind {
                match &slots[index] {
                    Slot::Buf(b) => {
                        self.buf_of.insert(u, *b);
                    }
                    Slot::Scalar(e) => {
                        self.scalar_of.insert(u, e.clone());
                    }
                }
            }
        }
    }

    /// Lowers a region to its own steps: its leading params bound to
    /// `leading`, its captures to this graph's values, its outputs written to
    /// `targets` (buffers by copy kernels, host variables by `SetVar`) in two
    /// phases when an output is read from another target (`a, b = b, a`).
    pub(super) fn lower_region(
        &mut self,
        r: &GRegion,
        leading: &[Slot],
        targets: &[Slot],
    ) -> R<Vec<Step>> {
        let mut bind: Vec<Slot> = leading.to_vec();
        for c in &r.captures {
            bind.push(if self.g.ty(*c).is_scalar() {
                Slot::Scalar(self.scalar(*c)?)
            } else {
                Slot::Buf(self.buf_as(*c, *c)?)
            });
        }
        // Generated kernels are named after the function and the region.
        let g = Graph {
            name: format!("{}_{}", self.g.name, r.graph.name),
            ..(*r.graph).clone()
        };
        let mut c = Lower::new(&g);
        c.buffers = std::mem::take(&mut self.buffers);
        c.kernels = std::mem::take(&mut self.kernels);
        c.temps = self.temps;
        c.vars = self.vars;
        let result = c.lower_region_body(&bind, targets);
        self.buffers = std::mem::take(&mut c.buffers);
        self.kernels = std::mem::take(&mut c.kernels);
        self.temps = c.temps;
        self.vars = c.vars;
        result?;
        Ok(c.steps)
    }

    fn lower_region_body(&mut self, bind: &[Slot], targets: &[Slot]) -> R<()> {
        let g = self.g;
        for (i, n) in g.nodes.iter().enumerate() {
            if let NodeKind::Param(p) = n.kind {
                match &bind[p] {
                    Slot::Buf(b) => {
                        self.buf_of.insert(NodeId(i as u32), *b);
                    }
                    Slot::Scalar(e) => {
                        self.scalar_of.insert(NodeId(i as u32), e.clone());
                    }
                }
            }
        }
        let (attention, absorbed) = self.attentions();
        self.run(&HashMap::new(), attention, absorbed)?;
        let target_bases: Vec<BufId> = targets
            .iter()
            .filter_map(|t| match t {
                Slot::Buf(b) => Some(self.base(*b)),
                _ => None,
            })
            .collect();
        let copy = |l: &mut Self, root: NodeId, to: BufId| {
            l.fused(
                &Group {
                    members: vec![],
                    root,
                    copy: true,
                },
                to,
            )
        };
        // Phase 1: values that sit in another target move to a temporary.
        let mut scalars: Vec<Option<ScalarExpr>> = vec![None; targets.len()];
        let several_vars = targets
            .iter()
            .filter(|t| matches!(t, Slot::Scalar(_)))
            .count()
            > 1;
        for (k, (&o, t)) in g.outputs.iter().zip(targets).enumerate() {
            match t {
                Slot::Buf(b) => {
                    let src = self.base(self.buf(o, o)?);
                    if src != self.base(*b) && target_bases.contains(&src) {
                        let t =
                            self.temp(g.ty(o).dims().to_vec(), self.buffers[b.0 as usize].dtype);
                        copy(self, o, t)?;
                        self.buf_of.insert(o, t);
                    }
                }
                Slot::Scalar(_) => {
                    let value = self.scalar(o)?;
                    scalars[k] = Some(if several_vars {
                        let v = self.fresh_var("t");
                        self.steps.push(Step::SetVar {
                            var: v.clone(),
                            value,
                        });
                        ScalarExpr::Var(v)
                    } else {
                        value
                    });
                }
            }
        }
        // Phase 2: into the targets.
        for (k, (&o, t)) in g.outputs.iter().zip(targets).enumerate() {
            match t {
                Slot::Buf(b) => {
                    if self.base(self.buf(o, o)?) != self.base(*b) {
                        copy(self, o, *b)?;
                    }
                }
                Slot::Scalar(ScalarExpr::Var(var)) => {
                    let value = scalars[k].take().unwrap_or(ScalarExpr::Var(var.clone()));
                    if value != ScalarExpr::Var(var.clone()) {
                        self.steps.push(Step::SetVar {
                            var: var.clone(),
                            value,
                        });
                    }
                }
                Slot::Scalar(_) => {}
            }
        }
        Ok(())
    }
}
