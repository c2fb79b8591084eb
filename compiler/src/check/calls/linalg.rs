//! `dot` in kernels and `matmul`/`@` on tensors: shapes, dtypes, precision and
//! the matrix instructions of the target.

use super::*;

impl Checker<'_> {
    #[allow(clippy::too_many_arguments)]
    pub fn dot_op(
        &mut self,
        l: &Val,
        r: &Val,
        acc: Option<(&Val, &Expr)>,
        precision: Option<(&Val, &Expr)>,
        span: Span,
        le: &Expr,
        re: &Expr,
    ) -> Val {
        if l.ty.is_err() || r.ty.is_err() {
            return Val::err();
        }
        let Some((_, ld)) = self.operand(l, le) else {
            return Val::err();
        };
        let Some((_, rd)) = self.operand(r, re) else {
            return Val::err();
        };
        for (d, v, e) in [(&ld, l, le), (&rd, r, re)] {
            if d.len() != 2 {
                self.report(
                    Diagnostic::new("E0411", e.span, format!("`dot` takes 2-D tiles; `{}` has rank {}", v.ty, d.len()))
                        .with_help("add an axis with `[:, None]` / `[None, :]`, or reduce with `sum(a * b, axis=k)`"),
                );
                return Val::err();
            }
        }
        // Tensor cores and the FMA path multiply floats only.
        for (v, e) in [(l, le), (r, re)] {
            if let Some(d) = v.ty.dtype().filter(|d| !d.is_float()) {
                self.report(
                    Diagnostic::new(
                        "E0311",
                        e.span,
                        format!("`dot` multiplies float tiles; this one is {d}"),
                    )
                    .with_help("convert the operands first: `.to(f16)` or `.to(f32)`"),
                );
                return Val::err();
            }
        }
        let (m, k1, k2, n) = (&ld[0], &ld[1], &rd[0], &rd[1]);
        if k1 != k2 {
            self.report(
                Diagnostic::new("E0403", span, format!("inner dims of `dot` differ: `{}` has K = {k1} but `{}` has K = {k2}", l.ty, r.ty))
                    .with_label(le.span, format!("this is {m} x {k1}"))
                    .with_label(re.span, format!("this is {k2} x {n}"))
                    .with_help("`dot(a, b)` multiplies M x K by K x N; transpose with `.T` or fix the slice sizes"),
            );
            return Val::err();
        }
        let (a, b) = (
            l.ty.dtype().unwrap_or(DType::F32),
            r.ty.dtype().unwrap_or(DType::F32),
        );
        if a != b {
            let widest = DType::join(a, b).unwrap_or(DType::F16);
            self.report(
                Diagnostic::new(
                    "E0301",
                    span,
                    format!("`dot` operands must have the same dtype: `{a}` and `{b}`"),
                )
                .with_label(le.span, format!("this is `{}`", l.ty))
                .with_label(re.span, format!("this is `{}`", r.ty))
                .with_help(format!(
                    "cast one side, e.g. `{}.to({widest})`",
                    describe(if widest == a { re } else { le })
                )),
            );
            return Val::err();
        }
        if !matches!(
            a,
            DType::F16
                | DType::BF16
                | DType::F8E4M3
                | DType::F8E5M2
                | DType::F32
                | DType::F64
                | DType::I8
        ) {
            self.report(
                Diagnostic::new(
                    "E0311",
                    span,
                    format!("`dot` does not support `{a}` operands"),
                )
                .with_help(
                    "dot takes f16, bf16, f8e4m3, f8e5m2, f32, f64 (or i8); cast with `.to(f16)`",
                ),
            );
            return Val::err();
        }
        let mut tf32 = false;
        if let Some((p, pe)) = precision {
            match &p.value {
                Some(Value::Str(s)) if s == "tf32" && a != DType::F32 => {
                    self.report(
                        Diagnostic::new(
                            "E0311",
                            pe.span,
                            format!("`precision=\"tf32\"` rounds f32 operands; these are `{a}`"),
                        )
                        .with_help("drop `precision=`, or multiply f32 tiles"),
                    );
                }
                Some(Value::Str(s)) if s == "tf32" => tf32 = true,
                Some(Value::Str(s)) if s == "ieee" => {}
                Some(Value::None) => {}
                _ if p.ty.is_err() => {}
                _ => self.report(Diagnostic::new(
                    "E0302",
                    pe.span,
                    "`precision=` must be \"tf32\" or \"ieee\"",
                )
                .with_help(
                    "write `precision=\"tf32\"` (tensor cores, tf32 rounding) or `precision=\"ieee\"` (full f32, the default)",
                )),
            }
        }
        // f64 accumulates in f64 (FMA units); every narrower float in f32.
        let out = match a {
            DType::I8 => DType::I32,
            DType::F64 => DType::F64,
            _ => DType::F32,
        };
        let result = vec![m.clone(), n.clone()];
        if let Some((acc, ae)) = acc {
            match &acc.ty {
                Ty::Err | Ty::NoneV => {}
                Ty::Tile { dims, dtype } => {
                    if *dims != result {
                        self.report(
                            Diagnostic::new(
                                "E0402",
                                ae.span,
                                format!(
                                    "the accumulator `{}` does not match the product shape {}",
                                    acc.ty,
                                    render_dims(&result)
                                ),
                            )
                            .with_help(format!(
                                "accumulate into `zeros({}, {out})`",
                                render_dims(&result)
                            )),
                        );
                    } else if *dtype != out {
                        self.report(
                            Diagnostic::new(
                                "E0301",
                                ae.span,
                                format!(
                                    "the accumulator is `{dtype}` but `dot` accumulates in `{out}`"
                                ),
                            )
                            .with_help(format!(
                                "accumulate into {} tile and cast the result afterwards",
                                crate::diag::a_code(out)
                            )),
                        );
                    }
                }
                other => {
                    self.operand(acc, ae);
                    if !matches!(other, Ty::Tensor { .. } | Ty::Ref { .. }) {
                        self.report(Diagnostic::new(
                            "E0302",
                            ae.span,
                            format!("the accumulator must be a tile, found `{other}`"),
                        )
                        .with_help(
                            "pass the running tile, e.g. `acc = dot(a, b, acc)` after `acc = zeros([BM, BN], f32)`",
                        ));
                    }
                }
            }
        }
        let tensor_cores = matches!(
            a,
            DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 | DType::I8
        ) || tf32;
        if tensor_cores {
            self.check_mma(a, tf32, [m, n, k1], span);
            self.usage.note_dot(&ld, &rd, a, span, self.loop_depth > 0);
        }
        Val::of(Ty::tile(result, out))
    }

    pub fn matmul_op(&mut self, l: &Val, r: &Val, span: Span, le: &Expr, re: &Expr) -> Val {
        if l.ty.is_err() || r.ty.is_err() {
            return Val::err();
        }
        let Some((lk, ld)) = self.operand(l, le) else {
            return Val::err();
        };
        let Some((rk, rd)) = self.operand(r, re) else {
            return Val::err();
        };
        for (d, v, e) in [(&ld, l, le), (&rd, r, re)] {
            if d.is_empty() {
                self.report(
                    Diagnostic::new(
                        "E0411",
                        e.span,
                        format!("`matmul` takes tensors of rank 1 or more, found `{}`", v.ty),
                    )
                    .with_help("multiply by a scalar with `*`"),
                );
                return Val::err();
            }
        }
        let (a1, b1) = (ld.len() == 1, rd.len() == 1);
        let a: Vec<Dim> = if a1 {
            vec![Dim::constant(1), ld[0].clone()]
        } else {
            ld.clone()
        };
        let b: Vec<Dim> = if b1 {
            vec![rd[0].clone(), Dim::constant(1)]
        } else {
            rd.clone()
        };
        let (ka, kb) = (&a[a.len() - 1], &b[b.len() - 2]);
        if ka != kb {
            self.report(
                Diagnostic::new("E0403", span, format!("inner dims of `matmul` differ: `{}` has K = {ka} but `{}` has K = {kb}", l.ty, r.ty))
                    .with_label(le.span, format!("this is `{}`", l.ty))
                    .with_label(re.span, format!("this is `{}`", r.ty))
                    .with_help("the last dim of the left operand must equal the second-to-last dim of the right one (transpose with `transpose(x, -2, -1)`)"),
            );
            return Val::err();
        }
        let Some(mut batch) = broadcast(&a[..a.len() - 2], &b[..b.len() - 2]) else {
            self.report(
                Diagnostic::new(
                    "E0402",
                    span,
                    format!(
                        "batch dims {} and {} of `matmul` do not broadcast",
                        render_dims(&a[..a.len() - 2]),
                        render_dims(&b[..b.len() - 2])
                    ),
                )
                .with_label(le.span, format!("this is `{}`", l.ty))
                .with_label(re.span, format!("this is `{}`", r.ty))
                .with_help(
                    "the batch dims (all but the last two) must be equal or 1 in each position; add a dim of 1 with `x[None]`",
                ),
            );
            return Val::err();
        };
        let (x, y) = (
            l.ty.dtype().unwrap_or(DType::F32),
            r.ty.dtype().unwrap_or(DType::F32),
        );
        if x != y {
            self.report(
                Diagnostic::new(
                    "E0301",
                    span,
                    format!("`matmul` operands must have the same dtype: `{x}` and `{y}`"),
                )
                .with_label(le.span, format!("this is `{}`", l.ty))
                .with_label(re.span, format!("this is `{}`", r.ty))
                .with_help(format!("cast one side, e.g. `{}.to({x})`", describe(re))),
            );
            return Val::err();
        }
        if x == DType::Bool {
            // As arithmetic on bools: no meaning the GPU has (E0311).
            self.report(
                Diagnostic::new("E0311", span, "`matmul` is not defined on `bool` values")
                    .with_label(le.span, format!("this is `{}`", l.ty))
                    .with_help(format!("convert first, e.g. `{}.to(i32)`", describe(le))),
            );
            return Val::err();
        }
        if !a1 {
            batch.push(a[a.len() - 2].clone());
        }
        if !b1 {
            batch.push(b[b.len() - 1].clone());
        }
        Val::of(make(lk.max(rk), batch, x, false))
    }
}
