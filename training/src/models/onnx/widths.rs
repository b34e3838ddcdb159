//! The hidden widths of an ONNX graph, traced through its [`Plan`] (docs/onnx.md, "Width
//! strategies"), so HeteroFL, FedRolex and FjORD slice a user's model as they slice the shipped
//! ones (`models/widths.rs` describes those by hand).
//!
//! Every affine or convolutional layer's outputs open a width of `c_out` units. The trace
//! follows each activation axis through the steps: elementwise functions, pools and
//! per-channel normalisations keep it (a GroupNorm sets its norm groups, a norm over the last
//! axis normalises the sub-model over its kept units); a transposition moves it; a reshape
//! that keeps whole units on one axis (a flatten: a channel becomes `H·W` consecutive
//! features) carries it with a larger block, and PyTorch's GroupNorm decomposition carries it
//! one norm group per row; a residual sum of two widths makes them one width (both sides must
//! keep the same units), as does a trainable tensor both reach; the next layer's weight takes
//! it on its input axis. A width is **pinned** (kept whole, not offered to the strategies)
//! when it reaches something whose meaning a cut would change: the graph's output, a softmax
//! or a mean across it, a norm over it and other axes, a constant spanning it, a tensor
//! another step reads whole, a reshape that splits its units (attention heads cut from a
//! projection), a grouped convolution. A pinned width costs only the saving: the model still
//! trains, that width stays whole.

use crate::models::onnx::plan::{Kernel, Layer, Norm, Operand, Plan, Step, Unary};
use crate::models::widths::axis;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::width::WidthGroup;
use std::collections::BTreeMap;

/// An axis that follows width `width` (an index into the trace's raw widths, later into
/// [`Widths::groups`]): unit `u` is its indices `u·block … (u+1)·block − 1`. With
/// `per_group` = G > 1 the axis holds the units of one of the width's G norm groups (the
/// groups lie along the axis before it): PyTorch's export of a GroupNorm below opset 21
/// reshapes `[C, H, W]` to `[G, C/G·H·W]`, normalises each row, and reshapes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Label {
    width: usize,
    block: usize,
    per_group: usize,
}

impl Label {
    /// The axis's length when its width keeps `kept` units.
    fn len(&self, kept: usize) -> usize {
        kept / self.per_group * self.block
    }
}

/// A plan's widths, and where each sits in the plan, to narrow it ([`Widths::narrow`]).
#[derive(Debug, Clone, Default)]
pub struct Widths {
    /// The widths the strategies may slice, in the order of the layers that open them.
    pub groups: Vec<WidthGroup>,
    /// For every activation slot, each axis after the batch: the group it follows.
    slots: Vec<Vec<Option<Label>>>,
    /// For every dense tensor of the plan, each axis of its shape in the file.
    tensors: Vec<Vec<Option<Label>>>,
    /// For every layer: the label of its input axis, and of its output axis.
    layers: Vec<(Option<Label>, Option<Label>)>,
}

/// One raw width of the trace: opened by a layer, merged by residual sums (union–find).
struct Raw {
    name: String,
    units: usize,
    parent: usize,
    pinned: bool,
    norm_groups: Option<usize>,
}

/// The trace in progress.
struct Trace<'p> {
    plan: &'p Plan,
    raw: Vec<Raw>,
    slots: Vec<Vec<Option<Label>>>,
    /// Every activation slot's dimensions after the batch.
    tails: Vec<Vec<usize>>,
    tensors: Vec<Vec<Option<Label>>>,
    /// Axes of dense tensors some step reads whole (beside an axis no width follows): a width
    /// that also reaches them is pinned, or the narrowed tensor would not fit that step.
    whole: Vec<Vec<bool>>,
    layers: Vec<(Option<Label>, Option<Label>)>,
}

impl Trace<'_> {
    fn root(&mut self, mut w: usize) -> usize {
        while self.raw[w].parent != w {
            let up = self.raw[self.raw[w].parent].parent;
            self.raw[w].parent = up;
            w = up;
        }
        w
    }

    fn pin(&mut self, label: Option<Label>) {
        if let Some(l) = label {
            let r = self.root(l.width);
            self.raw[r].pinned = true;
        }
    }

    /// Makes `a` and `b` one width (they index one axis); pins both when their units or
    /// blocks differ, since no one cut fits both.
    fn unite(&mut self, a: Label, b: Label) {
        let (ra, rb) = (self.root(a.width), self.root(b.width));
        let same_cut = a.block == b.block && a.per_group == b.per_group;
        if ra == rb && same_cut {
            return;
        }
        if !same_cut || self.raw[ra].units != self.raw[rb].units {
            self.raw[ra].pinned = true;
            self.raw[rb].pinned = true;
            return;
        }
        let (ga, gb) = (self.raw[ra].norm_groups, self.raw[rb].norm_groups);
        let conflict = matches!((ga, gb), (Some(x), Some(y)) if x != y);
        let pinned = self.raw[ra].pinned || self.raw[rb].pinned || conflict;
        let (keep, drop) = (ra.min(rb), ra.max(rb));
        self.raw[drop].parent = keep;
        self.raw[keep].pinned = pinned;
        self.raw[keep].norm_groups = ga.or(gb);
    }

    /// The units of `label`'s width.
    fn units_of(&mut self, label: Label) -> usize {
        let r = self.root(label.width);
        self.raw[r].units
    }

    /// `label` where a step needs a whole width on the axis (a layer's input, a pooled
    /// channel, a transposed axis): a per-group label is pinned and dropped.
    fn whole(&mut self, label: Option<Label>) -> Option<Label> {
        match label {
            Some(l) if l.per_group != 1 => {
                self.pin(Some(l));
                None
            }
            other => other,
        }
    }

    /// Width of `label` is normalised in `groups` groups of consecutive units.
    fn norm_groups(&mut self, label: Option<Label>, groups: usize) {
        let Some(l) = label else { return };
        let r = self.root(l.width);
        match self.raw[r].norm_groups {
            Some(g) if g != groups => self.raw[r].pinned = true,
            _ => self.raw[r].norm_groups = Some(groups),
        }
    }

    /// A new width of `units` units opened by the layer whose weight is `weight`.
    fn open(&mut self, weight: &str, units: usize) -> Label {
        let width = self.raw.len();
        let name = weight.strip_suffix(".weight").unwrap_or(weight).to_string();
        self.raw.push(Raw {
            name,
            units,
            parent: width,
            pinned: false,
            norm_groups: None,
        });
        Label {
            width,
            block: 1,
            per_group: 1,
        }
    }

    /// Axis `axis` of dense tensor `index` (in the file's shape) follows `label`.
    fn tensor_axis(&mut self, index: usize, axis: usize, label: Label) {
        let Some(label) = self.whole(Some(label)) else {
            return;
        };
        match self.tensors[index][axis] {
            None => self.tensors[index][axis] = Some(label),
            Some(old) => self.unite(old, label),
        }
    }

    /// Operand `op`, whose axes sit on the activation's axes `at[k]` (`None`: an axis the
    /// activation does not have), meets the activation's labels `labels`: a dense tensor's
    /// axis that spans a labelled axis follows it; a constant's pins it.
    fn operand(&mut self, op: &Operand, at: &[Option<usize>], labels: &[Option<Label>]) {
        let (shape, file) = match op {
            Operand::Act(_) => return,
            Operand::Const(c) => (c.shape.clone(), None),
            Operand::Tensor { index, shape } => (shape.clone(), Some(*index)),
        };
        let map = file.and_then(|i| view_to_file(&shape, &self.plan.tensors[i].1));
        if let (Some(index), None) = (file, &map) {
            self.whole[index].fill(true);
        }
        for (k, &dim) in shape.iter().enumerate() {
            if dim == 1 {
                continue; // broadcast along the width
            }
            let label = at.get(k).copied().flatten().and_then(|a| labels[a]);
            match (label, file, map.as_ref().and_then(|m| m[k])) {
                (Some(l), Some(index), Some(axis)) => self.tensor_axis(index, axis, l),
                (None, Some(index), Some(axis)) => self.whole[index][axis] = true,
                (Some(l), _, _) => self.pin(Some(l)),
                (None, _, _) => {}
            }
        }
    }

    /// Every dense tensor among `ops` is read whole (a step the trace does not cut).
    fn read_whole(&mut self, ops: &[Operand]) {
        for op in ops {
            if let Operand::Tensor { index, .. } = op {
                self.whole[*index].fill(true);
            }
        }
    }
}

/// For each axis of `view` (a dense tensor's shape as a step uses it), the axis of `file` it
/// is, when the two differ only by axes of size 1; `None` when the view regroups values.
fn view_to_file(view: &[usize], file: &[usize]) -> Option<Vec<Option<usize>>> {
    let file_axes: Vec<usize> = (0..file.len()).filter(|&a| file[a] != 1).collect();
    let mut next = file_axes.iter();
    let map: Vec<Option<usize>> = view
        .iter()
        .map(|&d| {
            if d == 1 {
                None
            } else {
                next.next().filter(|&&a| file[a] == d).copied()
            }
        })
        .collect();
    let matched = map.iter().flatten().count();
    (matched == file_axes.len() && view.iter().filter(|&&d| d != 1).count() == matched)
        .then_some(map)
}

/// `labels` of `from` carried to `to` by a reshape (row-major, no data moves): axes are
/// grouped into runs of equal products. A labelled axis carries to its run's first output axis
/// when it is its run's first input axis and each of its units fills whole indices there
/// (`block · rest_in` divisible by `rest_out`). PyTorch's GroupNorm decomposition is the one
/// other cut kept: a run `[C, …] → [G, X, …]` with G the width's norm groups splits the width
/// into one group's units on `X` ([`Label::per_group`]), and `[G, X, …] → [C, …]` joins them
/// again. Any other labelled axis is pinned.
fn reshape(
    trace: &mut Trace,
    from: &[usize],
    labels: &[Option<Label>],
    to: &[usize],
) -> Vec<Option<Label>> {
    let mut out = vec![None; to.len()];
    let (mut i, mut j) = (0, 0);
    while i < from.len() || j < to.len() {
        // Axes of size 1 on either side carry nothing: skip them (an unsqueeze, a squeeze).
        if i < from.len() && from[i] == 1 {
            trace.pin(labels[i]);
            i += 1;
            continue;
        }
        if j < to.len() && to[j] == 1 {
            j += 1;
            continue;
        }
        if i == from.len() || j == to.len() {
            break;
        }
        let (i0, j0) = (i, j);
        let (mut a, mut b) = (from[i], to[j]);
        while a != b && i < from.len() && j < to.len() {
            if a < b {
                i += 1;
                a *= from.get(i).copied().unwrap_or(1);
            } else {
                j += 1;
                b *= to.get(j).copied().unwrap_or(1);
            }
        }
        let (i1, j1) = (i.min(from.len() - 1), j.min(to.len() - 1));
        let run = Run {
            from: &from[i0..=i1],
            labels: &labels[i0..=i1],
            to: &to[j0..=j1],
        };
        let carried = carry(trace, run);
        for (k, label) in carried.into_iter().enumerate() {
            out[j0 + k] = label;
        }
        i = i1 + 1;
        j = j1 + 1;
    }
    out
}

/// One run of a reshape: input axes `from` (labelled `labels`) whose product is that of the
/// output axes `to`.
struct Run<'a> {
    from: &'a [usize],
    labels: &'a [Option<Label>],
    to: &'a [usize],
}

/// The labels a run of a reshape carries to its output axes.
fn carry(trace: &mut Trace, Run { from, labels, to }: Run) -> Vec<Option<Label>> {
    let mut out = vec![None; to.len()];
    let product = |d: &[usize]| -> usize { d.iter().product() };
    let rest_in = product(&from[1..]);
    let rest_out = product(&to[1..]);
    // The index of the input label the run carries; every other label in the run is pinned.
    let carried = match labels[0] {
        // A whole width: its units fill whole indices of the first output axis.
        Some(l) if l.per_group == 1 && (l.block * rest_in).is_multiple_of(rest_out) => {
            out[0] = Some(Label {
                block: l.block * rest_in / rest_out,
                ..l
            });
            Some(0)
        }
        // `[C, …] → [G, X, …]`: one norm group's units along X.
        Some(l)
            if l.per_group == 1
                && to.len() >= 2
                && to[0] > 1
                && trace.units_of(l).is_multiple_of(to[0])
                && (l.block * rest_in).is_multiple_of(product(&to[2..])) =>
        {
            trace.norm_groups(Some(l), to[0]);
            out[1] = Some(Label {
                block: l.block * rest_in / product(&to[2..]),
                per_group: to[0],
                ..l
            });
            Some(0)
        }
        // `[G, X, …] → [C, …]`: the groups joined again.
        None if from.len() >= 2 => match labels[1] {
            Some(l)
                if l.per_group == from[0]
                    && labels[2..].iter().all(Option::is_none)
                    && (l.block * product(&from[2..])).is_multiple_of(rest_out) =>
            {
                out[0] = Some(Label {
                    block: l.block * product(&from[2..]) / rest_out,
                    per_group: 1,
                    ..l
                });
                Some(1)
            }
            _ => None,
        },
        _ => None,
    };
    for (k, &l) in labels.iter().enumerate() {
        if carried != Some(k) {
            trace.pin(l);
        }
    }
    out
}

impl Widths {
    /// Traces `plan`'s widths.
    pub fn trace(plan: &Plan) -> Widths {
        let mut t = Trace {
            plan,
            raw: Vec::new(),
            slots: vec![Vec::new(); plan.slots],
            tails: vec![Vec::new(); plan.slots],
            tensors: per_axis(plan, None),
            whole: per_axis(plan, false),
            layers: vec![(None, None); plan.layers.len()],
        };
        t.slots[0] = vec![None; plan.input_tail.len()];
        t.tails[0] = plan.input_tail.clone();
        for step in &plan.steps {
            let out = t.step(step);
            t.tails[step.output] = step.tail.clone();
            t.slots[step.output] = out;
        }
        for l in t.slots[plan.output].clone() {
            t.pin(l);
        }
        t.finish()
    }

    /// `plan` narrowed to `units` kept units of each width (by name; a width not named stays
    /// whole): every axis that follows a width shrinks to its kept units, so the interpreter
    /// runs the sub-model the server's cut tensors describe. Its `initial` state is empty: a
    /// narrowed plan only loads tensors.
    pub fn narrow(&self, plan: &Plan, units: &BTreeMap<String, usize>) -> Plan {
        let kept: Vec<usize> = self
            .groups
            .iter()
            .map(|g| units.get(&g.name).copied().unwrap_or(g.units))
            .collect();
        let len = |full: usize, label: Option<Label>| label.map_or(full, |l| l.len(kept[l.width]));
        let tail = |full: &[usize], labels: &[Option<Label>]| -> Vec<usize> {
            full.iter().zip(labels).map(|(&d, &l)| len(d, l)).collect()
        };
        // Field by field, not `plan.clone()`: the initial values (the whole model) are not
        // copied for every narrowed build (FjORD narrows once per batch).
        let mut out = Plan {
            input_name: plan.input_name.clone(),
            input_tail: plan.input_tail.clone(),
            layers: plan.layers.clone(),
            tensors: plan.tensors.clone(),
            steps: plan.steps.clone(),
            slots: plan.slots,
            output: plan.output,
            classes: plan.classes,
            initial: ModelState::new(Vec::new()).expect("an empty state"),
        };
        for (layer, &(input, output)) in out.layers.iter_mut().zip(&self.layers) {
            match layer {
                Layer::Affine { c_in, c_out, .. } | Layer::Conv { c_in, c_out, .. } => {
                    *c_in = len(*c_in, input);
                    *c_out = len(*c_out, output);
                }
            }
        }
        for ((_, shape), labels) in out.tensors.iter_mut().zip(&self.tensors) {
            *shape = tail(shape, labels);
        }
        for step in &mut out.steps {
            step.tail = tail(&step.tail, &self.slots[step.output]);
            if let Kernel::Reshape(to) = &mut step.kernel {
                *to = step.tail.clone();
            }
            for op in &mut step.inputs {
                if let Operand::Tensor { index, shape } = op {
                    let file = &plan.tensors[*index].1;
                    let map = view_to_file(shape, file).unwrap_or_default();
                    let labels = &self.tensors[*index];
                    for (k, d) in shape.iter_mut().enumerate() {
                        if let Some(Some(axis)) = map.get(k) {
                            *d = len(*d, labels[*axis]);
                        }
                    }
                }
            }
        }
        out
    }
}

impl Trace<'_> {
    /// The labels of `step`'s output; what the step cannot cut is pinned.
    fn step(&mut self, step: &Step) -> Vec<Option<Label>> {
        let act = match step.inputs.first() {
            Some(Operand::Act(s)) => Some(*s),
            _ => None,
        };
        let input = act.map(|s| self.slots[s].clone()).unwrap_or_default();
        let rank = step.tail.len();
        let channel = [Some(0), None];
        match &step.kernel {
            Kernel::Affine(i) | Kernel::Conv(i) => {
                // An affine layer reads and writes the last axis, a convolution the
                // channels (axis 0), and its positions must stay whole.
                let (conv, weight, c_out) = match &self.plan.layers[*i] {
                    Layer::Affine { weight, c_out, .. } => (false, weight, *c_out),
                    Layer::Conv { weight, c_out, .. } => (true, weight, *c_out),
                };
                let at = if conv { 0 } else { input.len() - 1 };
                let opened = self.open(weight, c_out);
                self.layers[*i] = (self.whole(input[at]), Some(opened));
                let mut out = if conv {
                    for &l in &input[1..] {
                        self.pin(l);
                    }
                    vec![None; rank]
                } else {
                    input.clone()
                };
                out[at] = Some(opened);
                out
            }
            Kernel::Binary(_) => {
                let mut out: Vec<Option<Label>> = vec![None; rank];
                // Activation operands first: their labels meet on the output's axes.
                for op in &step.inputs {
                    let Operand::Act(s) = op else { continue };
                    let (labels, dims) = (self.slots[*s].clone(), self.tails[*s].clone());
                    let pad = rank - dims.len();
                    for (k, label) in labels.into_iter().enumerate() {
                        match (out[pad + k], label) {
                            (_, None) => {}
                            (None, Some(l)) => out[pad + k] = Some(l),
                            (Some(o), Some(l)) => self.unite(o, l),
                        }
                    }
                }
                // An activation axis of full size without a label meets a labelled one:
                // the cut would reach an axis nothing narrows.
                for op in &step.inputs {
                    let Operand::Act(s) = op else { continue };
                    let (labels, dims) = (self.slots[*s].clone(), self.tails[*s].clone());
                    let pad = rank - dims.len();
                    for k in 0..dims.len() {
                        if labels[k].is_none() && dims[k] != 1 {
                            self.pin(out[pad + k]);
                        }
                    }
                }
                for op in &step.inputs {
                    let shape = match op {
                        Operand::Act(_) => continue,
                        Operand::Tensor { shape, .. } => shape.clone(),
                        Operand::Const(c) => c.shape.clone(),
                    };
                    let at: Vec<Option<usize>> = (0..shape.len())
                        .map(|k| (k + rank).checked_sub(shape.len()))
                        .collect();
                    self.operand(op, &at, &out);
                }
                out
            }
            Kernel::Relu | Kernel::Erf => input,
            Kernel::Unary(Unary::Softmax { axis, .. }) => {
                self.pin(input[axis - 1]);
                input
            }
            Kernel::Unary(Unary::Transpose(perm)) => perm[1..]
                .iter()
                .map(|&a| self.whole(input[a - 1]))
                .collect(),
            Kernel::Unary(_) => input,
            Kernel::Reshape(to) => {
                let from = act.map(|s| self.tails[s].clone()).unwrap_or_default();
                reshape(self, &from, &input, to)
            }
            Kernel::MaxPool(_)
            | Kernel::AveragePool(_)
            | Kernel::GlobalAveragePool
            | Kernel::Pool { .. } => {
                for &l in &input[1..] {
                    self.pin(l);
                }
                let mut out = vec![None; rank];
                out[0] = self.whole(input[0]);
                out
            }
            Kernel::Mean(axes) => {
                for &a in axes {
                    self.pin(input[a - 1]);
                }
                input
            }
            Kernel::GroupNorm { groups, .. } | Kernel::Norm(Norm::Group { groups, .. }) => {
                self.norm_groups(input[0], *groups);
                for op in &step.inputs[1..] {
                    self.operand(op, &channel, &input);
                }
                input
            }
            Kernel::InstanceNormalization { .. } | Kernel::Norm(Norm::Batch { .. }) => {
                // Per channel over the positions: a width there is normalised over its
                // kept units, which only a GroupNorm's decomposition (one group's units
                // per row) means.
                if let Kernel::InstanceNormalization { .. } = step.kernel {
                    for &l in &input[1..] {
                        if l.is_some_and(|l| l.per_group == 1) {
                            self.pin(l);
                        }
                    }
                }
                for op in &step.inputs[1..] {
                    self.operand(op, &channel, &input);
                }
                input
            }
            // Over the last axis alone, as the shipped CNN's feature norm: a width there is
            // normalised over its kept units, its γ and β cut with it. Over more axes (a
            // width and the positions, say), the cut would change every statistic: pinned.
            Kernel::LayerNorm | Kernel::Norm(Norm::Layer { .. }) => {
                let from = match step.kernel {
                    Kernel::Norm(Norm::Layer { axis, .. }) => axis - 1,
                    _ => rank - 1,
                };
                if from == rank - 1 {
                    let last = self.whole(input[rank - 1]);
                    self.norm_groups(last, 1);
                    for op in &step.inputs[1..] {
                        self.operand(op, &[Some(rank - 1)], &input);
                    }
                } else {
                    for &l in &input[from..] {
                        self.pin(l);
                    }
                    self.read_whole(&step.inputs[1..]);
                }
                input
            }
            Kernel::GroupedConv { .. } => {
                self.read_whole(&step.inputs[1..]);
                for &l in &input {
                    self.pin(l);
                }
                vec![None; rank]
            }
        }
    }
}

impl Trace<'_> {
    /// The unpinned roots as width groups, every label renumbered to its group (a label of a
    /// pinned width becomes `None`: that axis stays whole).
    fn finish(mut self) -> Widths {
        let whole = std::mem::take(&mut self.whole);
        for (i, axes) in whole.iter().enumerate() {
            for (a, _) in axes.iter().enumerate().filter(|(_, w)| **w) {
                self.pin(self.tensors[i][a]);
            }
        }
        let mut index = BTreeMap::new();
        let mut groups: Vec<WidthGroup> = Vec::new();
        for w in 0..self.raw.len() {
            let r = self.root(w);
            if r == w && !self.raw[r].pinned {
                index.insert(r, groups.len());
                groups.push(WidthGroup {
                    name: self.raw[r].name.clone(),
                    units: self.raw[r].units,
                    norm_groups: self.raw[r].norm_groups.unwrap_or(1),
                    axes: Vec::new(),
                });
            }
        }
        let relabel = |t: &mut Self, l: Option<Label>| -> Option<Label> {
            let l = l?;
            let g = *index.get(&t.root(l.width))?;
            Some(Label { width: g, ..l })
        };
        let mut slots = std::mem::take(&mut self.slots);
        for labels in &mut slots {
            for l in labels.iter_mut() {
                *l = relabel(&mut self, *l);
            }
        }
        let mut tensors = std::mem::take(&mut self.tensors);
        for (i, labels) in tensors.iter_mut().enumerate() {
            for (a, l) in labels.iter_mut().enumerate() {
                *l = relabel(&mut self, *l);
                if let Some(l) = l {
                    groups[l.width]
                        .axes
                        .push(axis(&self.plan.tensors[i].0, a, l.block));
                }
            }
        }
        let mut layers = std::mem::take(&mut self.layers);
        for (i, (input, output)) in layers.iter_mut().enumerate() {
            *input = relabel(&mut self, *input);
            *output = relabel(&mut self, *output);
            let (weight, bias) = match &self.plan.layers[i] {
                Layer::Affine { weight, bias, .. } | Layer::Conv { weight, bias, .. } => {
                    (weight, bias)
                }
            };
            if let Some(l) = output {
                groups[l.width].axes.push(axis(weight, 0, 1));
                if let Some(b) = bias {
                    groups[l.width].axes.push(axis(b, 0, 1));
                }
            }
            if let Some(l) = input {
                groups[l.width].axes.push(axis(weight, 1, l.block));
            }
        }
        Widths {
            groups,
            slots,
            tensors,
            layers,
        }
    }
}

/// `fill` for every axis of every dense tensor of `plan`.
fn per_axis<T: Clone>(plan: &Plan, fill: T) -> Vec<Vec<T>> {
    plan.tensors
        .iter()
        .map(|(_, shape)| vec![fill.clone(); shape.len()])
        .collect()
}
