//! Width-sliced local training (HeteroFL, FedRolex, FjORD): a client trains the narrowed model
//! the server's sliced tensors describe and sends back tensors of exactly the sliced shapes;
//! HeteroFL's scaler divides exactly the layers whose outputs are sliced; cohorts never mix
//! widths; FjORD's ordered dropout at one full level is plain SGD, and without momentum it
//! leaves the units no batch drew untouched.

use crate::data::Dataset;
use crate::models::char_transformer::CharShape;
use crate::models::net::{Architecture, Net};
use crate::train::neural::{CharWindows, Cpu, CpuTraining, Examples, LocalMethod, NeuralClient};
use burn::tensor::{Tensor, TensorData};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::task::{LocalTrainer, Recipe, TrainTask};
use fedshard_protocol::width::{LocalWidth, WidthGroup, WidthSlice, coordinates, slice_state};
use fedshard_strategies::rng::{Purpose, stream, uniform};

/// HeteroFL's slice at `keep_ratio` by hand: the first `keep_ratio` of the units of each norm
/// group of every width.
fn first_units(groups: &[WidthGroup], keep_ratio: f64) -> WidthSlice {
    let kept = groups
        .iter()
        .map(|g| {
            let per = g.units / g.norm_groups;
            let keep = ((per as f64 * keep_ratio).ceil() as usize).max(1);
            let units = (0..g.units).filter(|u| u % per < keep).collect();
            (g.name.clone(), units)
        })
        .collect();
    WidthSlice {
        kept,
        keep_ratio,
        local: LocalWidth::Scaled,
    }
}

/// The task a width strategy sends: the global model of `arch` cut to `slice`.
fn task(arch: &Architecture, slice: &WidthSlice) -> TrainTask {
    let (state, _) = arch.initial_state(7).expect("builds");
    TrainTask {
        round: 1,
        client: 2,
        seed: 5,
        dense: slice_state(&state, &arch.width_groups(), slice).expect("slices"),
        width: Some(slice.clone()),
        shards: vec![],
        recipe: Recipe {
            learning_rate: 0.05,
            epochs: 1,
            batch_size: 8,
            momentum: 0.5,
            weight_decay: 1e-4,
            clip_lr: None,
            proximal_mu: 0.0,
        },
        uplink: Default::default(),
        variates: None,
    }
}

/// `len` random rows of `dim` features in [−1, 1], labels in `0..classes`.
fn random(len: usize, dim: usize, classes: usize) -> Dataset {
    let mut rng = stream(3, 0, 0, Purpose::Data);
    let x = (0..len * dim)
        .map(|_| (2.0 * uniform(&mut rng) - 1.0) as f32)
        .collect();
    let y = (0..len).map(|i| (i % classes) as u32).collect();
    Dataset::new(x, y, dim, classes).expect("valid")
}

fn client(arch: &Architecture, examples: Box<dyn Examples>) -> NeuralClient<CpuTraining> {
    NeuralClient {
        architecture: arch.clone(),
        examples,
        device: Default::default(),
        method: LocalMethod::Sgd,
    }
}

/// Trains `task` and checks the result has the sent names and shapes, finite values that
/// moved, and a finite loss.
fn trains_to_the_sliced_shapes(arch: &Architecture, examples: Box<dyn Examples>, r: f64) {
    let slice = first_units(&arch.width_groups(), r);
    let task = task(arch, &slice);
    let (full, _) = arch.initial_state(7).expect("builds");
    assert_ne!(task.dense, full, "{arch:?}: the slice narrows the model");
    let out = client(arch, examples).train(&task).expect("trains");
    assert!(out.loss.is_finite(), "{arch:?}: loss {}", out.loss);
    assert!(out.shards.is_empty());
    let shapes = |s: &ModelState| -> Vec<(String, Vec<usize>)> {
        s.tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect()
    };
    assert_eq!(shapes(&out.dense), shapes(&task.dense), "{arch:?}");
    for t in &out.dense.tensors {
        assert!(t.data.iter().all(|v| v.is_finite()), "{arch:?}: {}", t.name);
    }
    assert_ne!(
        out.dense, task.dense,
        "{arch:?}: training moved the tensors"
    );
}

#[test]
fn a_sliced_digits_cnn_trains_to_the_sliced_shapes() {
    let arch = Architecture::DigitsCnn { classes: 10 };
    trains_to_the_sliced_shapes(&arch, Box::new(random(24, 64, 10)), 0.5);
}

#[test]
fn a_sliced_mlp_trains_to_the_sliced_shapes() {
    let arch = Architecture::Mlp {
        inputs: 6,
        hidden: vec![10],
        classes: 3,
    };
    trains_to_the_sliced_shapes(&arch, Box::new(random(20, 6, 3)), 0.5);
}

#[test]
fn a_sliced_char_transformer_trains_to_the_sliced_shapes() {
    let shape = CharShape {
        vocab: 12,
        context: 6,
        width: 16,
        heads: 4,
        blocks: 2,
    };
    let text: Vec<u8> = (0..40).map(|i| (i * 7 % 12) as u8).collect();
    let examples = Box::new(CharWindows::all(text, shape.context));
    trains_to_the_sliced_shapes(&Architecture::CharTransformer(shape), examples, 0.5);
}

/// The MLP built from the same sliced tensors with the scaler at `keep_ratio`.
fn mlp(arch: &Architecture, task: &TrainTask, keep_ratio: f64) -> crate::models::mlp::Mlp<Cpu> {
    let width = WidthSlice {
        keep_ratio,
        ..task.width.clone().expect("sliced")
    };
    let tasks = [(&task.dense, &[][..], Some(&width))];
    match arch.load_cohort::<Cpu>(&tasks, &Default::default()) {
        Ok((Net::Mlp(m), _)) => m,
        other => panic!("not an MLP: {other:?}"),
    }
}

/// HeteroFL's scaler: the narrowed hidden layer's output is exactly the unscaled output / r,
/// the last layer's (whole outputs) is untouched, and a model loaded without a width (the
/// global model's evaluation) never scales.
#[test]
fn the_scaler_divides_sliced_outputs_by_the_keep_ratio() {
    let arch = Architecture::Mlp {
        inputs: 5,
        hidden: vec![8],
        classes: 3,
    };
    let r = 0.375;
    let task = task(&arch, &first_units(&arch.width_groups(), r));
    let (scaled, plain) = (mlp(&arch, &task, r), mlp(&arch, &task, 1.0));
    assert_eq!(scaled.layers[0].scaler, Some(r));
    assert_eq!(
        scaled.layers[1].scaler, None,
        "the last layer's outputs are whole"
    );
    assert!(plain.layers.iter().all(|l| l.scaler.is_none()));
    let cohort = crate::models::kernels::Cohort::single(4);
    let values = |t: Tensor<Cpu, 2>| t.into_data().into_vec::<f32>().expect("f32");
    let x = |width: usize| {
        let data: Vec<f32> = (0..4 * width).map(|i| (i as f32 * 0.37).sin()).collect();
        Tensor::<Cpu, 2>::from_data(TensorData::new(data, [4, width]), &Default::default())
    };
    let hidden = |m: &crate::models::mlp::Mlp<Cpu>| values(m.layers[0].forward(x(5), &cohort));
    let expected: Vec<f32> = hidden(&plain).iter().map(|v| v / r as f32).collect();
    assert_eq!(hidden(&scaled), expected);
    let kept = task.dense.get("fc1.weight").expect("named").shape[1];
    let last = |m: &crate::models::mlp::Mlp<Cpu>| values(m.layers[1].forward(x(kept), &cohort));
    assert_eq!(last(&scaled), last(&plain));
    let (global, _) = arch.initial_state(7).expect("builds");
    let Net::Mlp(g) = arch
        .load::<Cpu>(&global, &[], &Default::default())
        .expect("loads")
        .0
    else {
        unreachable!()
    };
    assert!(g.layers.iter().all(|l| l.scaler.is_none()));
}

/// Which layers of the CNN and the character model scale: those whose outputs a width slices.
#[test]
fn the_scaler_sits_on_the_sliced_output_layers_only() {
    let cnn = Architecture::DigitsCnn { classes: 10 };
    let task_cnn = task(&cnn, &first_units(&cnn.width_groups(), 0.5));
    let tasks = [(&task_cnn.dense, &[][..], task_cnn.width.as_ref())];
    let Ok((Net::Cnn(m), _)) = cnn.load_cohort::<Cpu>(&tasks, &Default::default()) else {
        panic!("builds")
    };
    for conv in [&m.conv0, &m.conv1, &m.conv2] {
        assert_eq!(conv.scaler, Some(0.5));
    }
    assert_eq!((m.fc0.scaler, m.fc1.scaler), (Some(0.5), None));
    let chars = Architecture::CharTransformer(CharShape {
        vocab: 12,
        context: 6,
        width: 16,
        heads: 4,
        blocks: 1,
    });
    let task_chars = task(&chars, &first_units(&chars.width_groups(), 0.5));
    let tasks = [(&task_chars.dense, &[][..], task_chars.width.as_ref())];
    let Ok((Net::CharTransformer(m), _)) = chars.load_cohort::<Cpu>(&tasks, &Default::default())
    else {
        panic!("builds")
    };
    let (attn, mlp) = (&m.blocks[0].attn, &m.blocks[0].mlp);
    assert_eq!(attn.heads, 2);
    for layer in [&attn.q, &attn.k, &attn.v, &mlp.fc] {
        assert_eq!(layer.scaler, Some(0.5));
    }
    for layer in [&attn.o, &mlp.proj, &m.head] {
        assert_eq!(layer.scaler, None);
    }
}

/// Tasks of different widths (or keep ratios) never share a cohort; tasks keeping different
/// units of the same widths (FedRolex's rolling windows) do.
#[test]
fn cohort_keys_follow_the_widths() {
    let arch = Architecture::Mlp {
        inputs: 6,
        hidden: vec![10],
        classes: 3,
    };
    let c = client(&arch, Box::new(random(4, 6, 3)));
    let groups = arch.width_groups();
    let key = |slice: &WidthSlice| c.cohort_key(&task(&arch, slice)).expect("SGD");
    let half = first_units(&groups, 0.5);
    let quarter = first_units(&groups, 0.25);
    assert_ne!(key(&half), key(&quarter));
    let mut rolled = half.clone();
    rolled.kept.insert("fc0".into(), (5..10).collect());
    assert_eq!(key(&half), key(&rolled));
    let mut full = task(&arch, &half);
    full.width = None;
    assert_ne!(c.cohort_key(&full), Some(key(&half)));
}

/// FjORD's slice of `arch` at capacity `keep_ratio`, trained by ordered dropout over `levels`.
fn ordered(arch: &Architecture, keep_ratio: f64, levels: &[f64]) -> WidthSlice {
    WidthSlice {
        local: LocalWidth::OrderedDropout {
            levels: levels.to_vec(),
        },
        ..first_units(&arch.width_groups(), keep_ratio)
    }
}

/// Ordered dropout with one level, the full width, draws the whole model every batch: its
/// steps, taken by hand in the slice's space, are those of plain SGD with momentum and decay
/// on the unsliced model (to f32 rounding, the arithmetic's order differs).
#[test]
fn fjord_at_one_full_level_is_plain_sgd() {
    let arch = Architecture::DigitsCnn { classes: 10 };
    let fjord = task(&arch, &ordered(&arch, 1.0, &[1.0]));
    let mut plain = fjord.clone();
    plain.width = None;
    let c = client(&arch, Box::new(random(20, 64, 10)));
    assert_eq!(c.cohort_key(&fjord), None, "a FjORD client trains alone");
    let (a, b) = (
        c.train(&fjord).expect("trains"),
        c.train(&plain).expect("trains"),
    );
    assert!((a.loss - b.loss).abs() < 1e-5, "{} vs {}", a.loss, b.loss);
    for (x, y) in a.dense.tensors.iter().zip(&b.dense.tensors) {
        assert_eq!(x.name, y.name);
        let worst = x
            .data
            .iter()
            .zip(&y.data)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{}: {worst}", x.name);
    }
    assert_ne!(a.dense, fjord.dense, "it trained");
}

/// Without momentum, a client of capacity 1 whose only level is 0.5 moves the values of the
/// leading half of every width and nothing else; its run is reproducible.
#[test]
fn fjord_without_momentum_leaves_undrawn_units_untouched() {
    let arch = Architecture::Mlp {
        inputs: 6,
        hidden: vec![10, 8],
        classes: 3,
    };
    let slice = ordered(&arch, 1.0, &[0.5]);
    let mut t = task(&arch, &slice);
    t.recipe.momentum = 0.0;
    let c = client(&arch, Box::new(random(20, 6, 3)));
    let out = c.train(&t).expect("trains");
    assert_eq!(out, c.train(&t).expect("trains"), "reproducible");
    let (local, prefix) = slice
        .ordered_prefix(&arch.width_groups(), 0.5)
        .expect("prefix");
    for (before, after) in t.dense.tensors.iter().zip(&out.dense.tensors) {
        let drawn = coordinates(before, &local, &prefix.kept)
            .expect("fits")
            .unwrap_or_else(|| (0..before.data.len()).collect());
        for i in 0..before.data.len() {
            let moved = before.data[i] != after.data[i];
            assert_eq!(moved, drawn.contains(&i), "{} value {i}", before.name);
        }
    }
}

/// A FjORD client below full capacity trains its slice's shapes, and its levels reach the
/// narrowest: a single batch at level 0.2 of a capacity-0.5 client still sends the whole slice.
#[test]
fn a_fjord_client_trains_its_slice_at_drawn_levels() {
    let arch = Architecture::Mlp {
        inputs: 6,
        hidden: vec![10],
        classes: 3,
    };
    let t = task(&arch, &ordered(&arch, 0.5, &[0.2, 0.4, 0.5]));
    let out = client(&arch, Box::new(random(20, 6, 3)))
        .train(&t)
        .expect("trains");
    assert!(out.loss.is_finite());
    let shapes =
        |s: &ModelState| -> Vec<Vec<usize>> { s.tensors.iter().map(|t| t.shape.clone()).collect() };
    assert_eq!(shapes(&out.dense), shapes(&t.dense));
    assert_eq!(t.dense.get("fc0.weight").expect("named").shape, vec![5, 6]);
}

/// The shipped digits CNN exported as ONNX (tests/fixtures/onnx/digits_cnn.onnx), sliced by
/// the widths traced through its graph, trains to the bytes the shipped model sliced by its
/// hand-written description trains to: the same cut, the same narrowed layers; under
/// HeteroFL's scaler on a slice that is no prefix (FedRolex's window past the end), and under
/// FjORD's ordered dropout (a narrower prefix drawn per batch) on a prefix.
#[test]
fn a_sliced_onnx_digits_cnn_trains_to_the_shipped_models_bytes() {
    let file = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/onnx/digits_cnn.onnx");
    let path = crate::models::onnx::OnnxFile::read(&file).expect("loads");
    let onnx = Architecture::Onnx { path: path.clone() };
    let shipped = Architecture::DigitsCnn { classes: 10 };
    let groups = onnx.width_groups();
    let rolled = |shift: usize| {
        groups
            .iter()
            .map(|g| {
                let per = g.units / g.norm_groups;
                let units = (0..g.units)
                    .filter(|u| (u % per + shift) % per < per / 2)
                    .collect();
                (g.name.clone(), units)
            })
            .collect()
    };
    let fjord = LocalWidth::OrderedDropout {
        levels: vec![0.25, 0.5],
    };
    for (kept, local) in [(rolled(3), LocalWidth::Scaled), (rolled(0), fjord)] {
        let slice = WidthSlice {
            kept,
            keep_ratio: 0.5,
            local,
        };
        let global = path.model.initial_state();
        let mut sliced = task(&shipped, &slice);
        sliced.dense = slice_state(global, &groups, &slice).expect("slices");
        assert_eq!(
            sliced.dense,
            slice_state(global, &shipped.width_groups(), &slice).expect("slices"),
            "the traced widths cut what the hand-written ones cut"
        );
        let data = || Box::new(random(24, 64, 10));
        let ours = client(&onnx, data()).train(&sliced).expect("trains");
        let theirs = client(&shipped, data()).train(&sliced).expect("trains");
        assert_ne!(ours.dense, sliced.dense, "training moved the tensors");
        assert_eq!(ours.dense, theirs.dense, "{:?}", slice.local);
        assert_eq!(ours.loss.to_bits(), theirs.loss.to_bits());
    }
}
