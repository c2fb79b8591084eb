//! The `std` package, embedded at build time from `stdlib/` (see build.rs).

include!(concat!(env!("OUT_DIR"), "/stdlib_files.rs"));

/// The source of a stdlib module by dotted path (`"std.nn"`).
pub fn source(module: &str) -> Option<&'static str> {
    STDLIB_FILES
        .iter()
        .find(|(name, _)| *name == module)
        .map(|(_, text)| *text)
}

/// Every stdlib module path, sorted.
pub fn modules() -> impl Iterator<Item = &'static str> {
    STDLIB_FILES.iter().map(|(name, _)| *name)
}
