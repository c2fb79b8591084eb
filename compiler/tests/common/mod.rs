//! What the validation tests against an outside compiler (`ptxas.rs`,
//! `clang_amdgpu.rs`) share: running without the tool, choosing parts,
//! ending with the failures, and the corpus of `.tsr` kernels they measure
//! ([`corpus`]).

pub mod corpus;

use std::fmt::Display;
use std::process::ExitCode;

/// The tool a test runs against, or how the test ends without it (`what`
/// names the test): skipped with a note, except under CI (`CI` set), where
/// that is a failure.
pub fn tool_or_exit<T>(found: Result<T, impl Display>, what: &str) -> Result<T, ExitCode> {
    match found {
        Ok(t) => Ok(t),
        Err(e) if std::env::var_os("CI").is_none() => {
            println!("SKIPPED {what}: {e}");
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("FAIL {what}: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// Whether part `name` runs where the parts are limited to `only` (`a,b`,
/// from an environment variable): every part runs without it.
pub fn runs(only: Option<&str>, name: &str) -> bool {
    only.is_none_or(|o| o.split(',').any(|p| p == name))
}

/// How a test ends: success, or each failure printed (`FAIL ...`) and
/// failure.
pub fn finish(failures: &[String]) -> ExitCode {
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        for f in failures {
            println!("FAIL {f}");
        }
        ExitCode::FAILURE
    }
}
