//! `load`, `store` and `atomic_add`: pointers, masks and what they address.

use super::*;

impl Checker<'_> {
    pub(super) fn memory(
        &mut self,
        name: Builtin,
        ptr: &ArgV,
        second: Option<&ArgV>,
        third: Option<&ArgV>,
    ) -> Val {
        let (dims, dtype) = match &ptr.val.ty {
            // The GPU's atomic adds: f32, f64, f16, i32, u32, i64 (others
            // would need compare-and-swap loops, not generated).
            Ty::Ref { dtype, .. }
                if name == B::AtomicAdd
                    && !matches!(
                        dtype,
                        DType::F32 | DType::F64 | DType::F16 | DType::I32 | DType::U32 | DType::I64
                    ) =>
            {
                self.report(
                    Diagnostic::new(
                        "E0311",
                        ptr.expr.span,
                        format!("`atomic_add` on {dtype} tensors is not supported"),
                    )
                    .with_help("accumulate into an f32, f64, f16, i32, u32 or i64 tensor"),
                );
                return Val::of(Ty::NoneV);
            }
            Ty::Ref { dims, dtype } | Ty::Tensor { dims, dtype } => (dims.clone(), *dtype),
            Ty::Err => {
                return if name == B::Load {
                    Val::err()
                } else {
                    Val::of(Ty::NoneV)
                }
            }
            other => {
                self.report(
                    Diagnostic::new(
                        "E0302",
                        ptr.expr.span,
                        format!(
                            "`{name}` takes a slice of a tensor, found {} `{other}`",
                            other.kind_name()
                        ),
                    )
                    .with_help(format!(
                        "write e.g. `{name}(x[i : i + BLOCK]{})`",
                        if name == B::Load { "" } else { ", tile" }
                    )),
                );
                return Val::err();
            }
        };
        let (mask, other, value) = if name == B::Load {
            (second, third, None)
        } else {
            (third, None, second)
        };
        if let Some(m) = mask {
            if let Some((_, md, mdt)) = self.array(m) {
                if mdt != DType::Bool {
                    self.report(
                        Diagnostic::new(
                            "E0301",
                            m.expr.span,
                            format!("`mask=` must be a bool tile, found `{}`", m.val.ty),
                        )
                        .with_help("compare to get a mask, e.g. `offs < N`"),
                    );
                } else if broadcast(&md, &dims).as_deref() != Some(&dims[..]) {
                    self.report(
                        Diagnostic::new(
                            "E0402",
                            m.expr.span,
                            format!(
                                "mask of shape {} does not broadcast to the slice shape {}",
                                render_dims(&md),
                                render_dims(&dims)
                            ),
                        )
                        .with_label(
                            ptr.expr.span,
                            format!("this slice is {}", render_dims(&dims)),
                        )
                        .with_help(
                            format!("build the mask from the offsets of this slice, so that it broadcasts to {}", render_dims(&dims)),
                        ),
                    );
                }
            }
        }
        if let Some(o) = other {
            if let Some((_, od, odt)) = self.array(o) {
                if broadcast(&od, &dims).as_deref() != Some(&dims[..]) {
                    self.report(
                        Diagnostic::new(
                            "E0402",
                            o.expr.span,
                            format!(
                                "`other=` of shape {} does not broadcast to the slice shape {}",
                                render_dims(&od),
                                render_dims(&dims)
                            ),
                        )
                        .with_help(format!(
                            "give one number (e.g. `other=0.0`) or a tile that broadcasts to {}",
                            render_dims(&dims)
                        )),
                    );
                } else if !(o.val.ty.is_weak() && (dtype.is_float() || !odt.is_float()))
                    && !odt.widens_to(dtype)
                {
                    self.report(
                        Diagnostic::new(
                            "E0301",
                            o.expr.span,
                            format!("`other=` is `{odt}` but the tensor is `{dtype}`"),
                        )
                        .with_help(format!("convert it: `{}.to({dtype})`", describe(o.expr))),
                    );
                }
            }
        }
        if name == B::Load {
            return Val::of(Ty::tile(dims, dtype));
        }
        let Some(v) = value else {
            return Val::of(Ty::NoneV);
        };
        if v.val.ty.is_err() {
            return Val::of(Ty::NoneV);
        }
        let Some((k, vd, vdt)) = self.array(v) else {
            return Val::of(Ty::NoneV);
        };
        if k != Kind::Scalar && vd != dims {
            self.report(
                Diagnostic::new(
                    "E0408",
                    v.expr.span,
                    format!("the {name}d tile `{}` does not match the slice shape {}", v.val.ty, render_dims(&dims)).replace("atomic_addd", "added"),
                )
                .with_label(ptr.expr.span, format!("this slice has shape {}", render_dims(&dims)))
                .with_help("the tile must have exactly the slice's shape (only scalars broadcast); adjust the slice bounds or the tile"),
            );
            return Val::of(Ty::NoneV);
        }
        let weak_ok = v.val.ty.is_weak() && (dtype.is_float() || !vdt.is_float());
        if !weak_ok && !vdt.widens_to(dtype) {
            self.report(
                Diagnostic::new(
                    "E0301",
                    v.expr.span,
                    format!(
                        "storing `{vdt}` values into {} tensor would narrow them",
                        crate::diag::a_code(dtype)
                    ),
                )
                .with_label(
                    ptr.expr.span,
                    format!("this is {} tensor", crate::diag::a_code(dtype)),
                )
                .with_help(format!(
                    "cast explicitly: `{}.to({dtype})`",
                    describe(v.expr)
                )),
            );
        }
        Val::of(Ty::NoneV)
    }
}
