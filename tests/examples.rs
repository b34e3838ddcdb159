//! Runs every program of `examples/` as part of `cargo test`, so the public API they use
//! cannot rot: each example is compiled into this test crate as a module and its `main`
//! called; an example asserts its own result (a hand computation, an accuracy threshold) and
//! returns an error when it does not hold. Compiling them in, rather than running the example
//! binaries, works for `cargo test --test examples` too, which does not build examples.

#[path = "../examples/custom_aggregator.rs"]
mod custom_aggregator;
#[path = "../examples/custom_dataset.rs"]
mod custom_dataset;
#[path = "../examples/custom_model.rs"]
mod custom_model;

/// A network of the program's own, built through the `Builder` and sharded, learns the digits.
#[test]
fn custom_model_learns_the_digits_with_a_sharded_layer() {
    custom_model::main().expect("examples/custom_model.rs");
}

/// An `Aggregator` of the program's own matches a hand computation and drives a run.
#[test]
fn custom_aggregator_matches_its_hand_computation_and_learns() {
    custom_aggregator::main().expect("examples/custom_aggregator.rs");
}

/// Rows built in memory, partitioned by the program, are learned by a federation.
#[test]
fn custom_dataset_is_learned() {
    custom_dataset::main().expect("examples/custom_dataset.rs");
}
