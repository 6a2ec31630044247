//! Stand-ins for the provider libraries that Debian's perftest links directly (`libmlx5.so.1`,
//! `libefa.so.1`, bound at load time with BIND_NOW): the entry points it imports, each
//! answering as the real library does for a device that is not of its kind (NULL or an error
//! with EOPNOTSUPP), so perftest loads and takes its generic verbs path; and every other function
//! the real libraries export (libfabric and rdma-core's own tests bind them all at load time).

mod efa;
/// The rest of each library's exports, generated (`capi/tools/gen_stubs.py`).
mod efa_gen;
mod mlx5;
mod mlx5_gen;
