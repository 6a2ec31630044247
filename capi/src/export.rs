//! Binding exported functions to rdma-core's symbol versions.
//!
//! Programs linked against rdma-core import versioned symbols (`ibv_reg_mr@IBVERBS_1.1`). An
//! exported `#[no_mangle]` function gets its version from a `.symver` directive naming the
//! node; `versions.map` declares the nodes. rustc's own version script stays in charge of
//! what is local.

/// `versioned!(ibv_open_device @ "IBVERBS_1.1", ...)`: make each function the default
/// definition of its name at that version.
macro_rules! versioned {
    ($($name:ident @ $ver:literal),* $(,)?) => {
        core::arch::global_asm!(
            $(concat!(".symver ", stringify!($name), ", ", stringify!($name), "@@", $ver),)*
        );
    };
}
