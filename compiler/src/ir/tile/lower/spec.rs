//! The compile-time values a kernel is lowered with ([`Specialization`]) and
//! the `-D` defines of the command line and sessions that fill them in
//! ([`Define`]).

use std::collections::BTreeMap;

/// The compile-time values a kernel is lowered with: const parameters (by
/// name; bools as 0/1) and specialised tensor dims. Names that are neither are
/// ignored, so one specialization can serve every kernel of a file.
///
/// `divisors` are divisibility assumptions (`-D K%8`): a run-time tensor dim or
/// integer scalar parameter is promised to be a multiple of a power of two
/// without fixing its value. The kernel records them (`Kernel::divisibility`),
/// the code generator uses them in alignment proofs (vector loads, `cp.async`)
/// and checks them at kernel entry (a launch that breaks one traps). A divisor
/// of a name that is fixed (`-D K=64`, a const parameter) must divide its value
/// (E0513).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Specialization {
    pub values: BTreeMap<String, i64>,
    pub divisors: BTreeMap<String, u64>,
    /// Float const parameters given at a launch (`s=3.0`), as `f64` bit
    /// patterns so that the specialization stays a hashable query key.
    pub floats: BTreeMap<String, u64>,
    /// The divisors are facts of the launch's own values (the executor's
    /// run-time specialisation), true by construction: the kernel assumes
    /// them without checking them at entry. `-D` divisors are checked.
    pub trusted: bool,
    /// The target the kernel is lowered for, where one is known: it picks
    /// the configuration an `@autotune` space gives values not fixed here
    /// (the first tried on this arch, language change 45). `None`: the
    /// space's first configuration (the CPU's).
    pub arch: Option<crate::target::Arch>,
}

/// One `-D` argument: `NAME=VALUE` fixes a value, `NAME%DIVISOR` assumes a
/// power-of-two divisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Define {
    Value(String, i64),
    Divisor(String, u64),
}

impl Define {
    pub fn name(&self) -> &str {
        match self {
            Define::Value(n, _) | Define::Divisor(n, _) => n,
        }
    }
}

fn check_define_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        || name.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!("`{name}` is not a name"));
    }
    Ok(())
}

impl Specialization {
    pub fn new() -> Self {
        Specialization::default()
    }

    /// The whole specialization `k` was lowered under: its fixed values and
    /// divisors (with the dims lowering added), and `floats` (the kernel
    /// keeps float consts as values, not bit patterns).
    pub fn of_kernel(k: &crate::ir::tile::Kernel, floats: BTreeMap<String, u64>) -> Self {
        Specialization {
            values: k.specialization.iter().cloned().collect(),
            divisors: k.divisibility.iter().cloned().collect(),
            floats,
            trusted: k.divisibility_trusted,
            // The tuned values are among `values` already.
            arch: None,
        }
    }

    /// [`Self::of_kernel`] with the launch options (`num_warps`,
    /// `num_stages`) that `given`, the specialization `k` was lowered
    /// under, named (an autotune configuration's): the kernel keeps them
    /// as fields of its own, not among its specialised values.
    pub fn of_launch(k: &crate::ir::tile::Kernel, given: &Specialization) -> Self {
        let mut spec = Self::of_kernel(k, given.floats.clone());
        for (option, chosen) in [("num_warps", k.num_warps), ("num_stages", k.num_stages)] {
            if given.values.contains_key(option) {
                spec.values.insert(option.to_string(), i64::from(chosen));
            }
        }
        spec
    }

    pub fn with(mut self, name: impl Into<String>, value: i64) -> Self {
        self.values.insert(name.into(), value);
        self
    }

    pub fn get(&self, name: &str) -> Option<i64> {
        self.values.get(name).copied()
    }

    pub fn with_divisor(mut self, name: impl Into<String>, divisor: u64) -> Self {
        self.divisors.insert(name.into(), divisor);
        self
    }

    /// Adds one `-D` argument (the last of several for one name wins).
    pub fn add(&mut self, d: &Define) {
        match d {
            Define::Value(n, v) => {
                self.values.insert(n.clone(), *v);
            }
            Define::Divisor(n, k) => {
                self.divisors.insert(n.clone(), *k);
            }
        }
    }

    /// Parses one `-D` argument: `NAME=VALUE` (see `parse_define`) or
    /// `NAME%DIVISOR`, a power of two from 2 to 2^30 (`K%8`: K is a multiple of 8).
    pub fn parse_define_arg(text: &str) -> Result<Define, String> {
        match (text.split_once('%'), text.contains('=')) {
            (Some((name, k)), false) => {
                let name = name.trim();
                check_define_name(name)?;
                let k = k.trim().replace('_', "");
                match k.parse::<i64>() {
                    Ok(n) if (2..=1 << 30).contains(&n) && n.count_ones() == 1 => {
                        Ok(Define::Divisor(name.to_string(), n as u64))
                    }
                    Ok(_) => Err(format!(
                        "`{text}`: the divisor must be a power of two from 2 to 2^30 (e.g. `{name}%8`)"
                    )),
                    Err(_) => Err(format!(
                        "`{text}`: `{}` is not an integer divisor (NAME%DIVISOR, e.g. `{name}%8`)",
                        k
                    )),
                }
            }
            _ => Self::parse_define(text).map(|(n, v)| Define::Value(n, v)),
        }
    }

    /// Sets a float const parameter.
    pub fn with_float(mut self, name: impl Into<String>, value: f64) -> Self {
        self.floats.insert(name.into(), value.to_bits());
        self
    }

    /// The float given for a const parameter.
    pub fn float(&self, name: &str) -> Option<f64> {
        self.floats.get(name).map(|b| f64::from_bits(*b))
    }

    /// Parses `NAME=VALUE` (`-D` on the command line): an integer (`128`,
    /// `0x80`, `1_024`, `-1`) or a bool (`True`/`False`, `true`/`false`).
    pub fn parse_define(text: &str) -> Result<(String, i64), String> {
        let Some((name, value)) = text.split_once('=') else {
            return Err(format!("`{text}` is not NAME=VALUE or NAME%DIVISOR"));
        };
        let name = name.trim();
        check_define_name(name)?;
        let v = value.trim().replace('_', "");
        let parsed = match v.as_str() {
            "True" | "true" => Some(1),
            "False" | "false" => Some(0),
            _ => {
                let (neg, digits) = match v.strip_prefix('-') {
                    Some(d) => (true, d),
                    None => (false, v.as_str()),
                };
                let n = match digits
                    .strip_prefix("0x")
                    .or_else(|| digits.strip_prefix("0X"))
                {
                    Some(hex) => i64::from_str_radix(hex, 16).ok(),
                    None => digits.parse::<i64>().ok(),
                };
                n.map(|n| if neg { -n } else { n })
            }
        };
        match parsed {
            Some(n) => Ok((name.to_string(), n)),
            None => Err(format!(
                "`{}` is not an integer or a bool (for `{name}`)",
                value.trim()
            )),
        }
    }
}
