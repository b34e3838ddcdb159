//! Rows scaled by one number each: a factor's rows by its terms' ω, a gradient's by ClipLR's
//! factors. One pass over contiguous rows, where burn-ndarray's broadcasting product walks the
//! tensor element by element through a generic closure.

use super::{row_len, tensor, values};
use burn::tensor::TensorMetadata;
use burn_ndarray::NdArrayTensor;

/// `x · scale` for `x` of shape `… × c` and `scale` of shape `… × 1` (the same leading
/// dimensions): each row of `x` times its number, the same f32 products as the broadcast.
pub(super) fn scale_rows(x: NdArrayTensor, scale: NdArrayTensor) -> NdArrayTensor {
    let shape = x.shape();
    let scale_shape = scale.shape();
    let c = row_len(&shape);
    assert!(
        row_len(&scale_shape) == 1
            && scale_shape.num_dims() == shape.num_dims()
            && scale_shape.num_elements() * c == shape.num_elements(),
        "scale_rows: a scale of shape {scale_shape:?} for rows of shape {shape:?}"
    );
    let (x, scale) = (values(&x), values(&scale));
    let mut out = Vec::with_capacity(x.len());
    for (row, &s) in x.chunks_exact(c.max(1)).zip(scale.iter()) {
        out.extend(row.iter().map(|v| v * s));
    }
    tensor(out, shape)
}

#[cfg(test)]
mod tests {
    use crate::models::kernels::scale_rows;
    use burn::backend::NdArray;
    use burn::tensor::{Tensor, TensorData};

    /// The same bits as burn's broadcasting product, for a contiguous tensor and for a
    /// transposed view (a factor read in place).
    #[test]
    fn scaled_rows_are_the_broadcast_products_bit_for_bit() {
        let device = Default::default();
        let values: Vec<f32> = (0..2 * 3 * 5)
            .map(|i| (i as f32 * 0.37).sin() * 3.1)
            .collect();
        let x = Tensor::<NdArray, 3>::from_data(TensorData::new(values, [2, 3, 5]), &device);
        let scale = Tensor::<NdArray, 3>::from_data(
            TensorData::new(vec![0.5f32, -1.7, 3.3, 1e-3, 7.0, -0.25], [2, 3, 1]),
            &device,
        );
        let broadcast = (x.clone() * scale.clone()).into_data();
        assert_eq!(scale_rows(x.clone(), scale.clone()).into_data(), broadcast);
        let transposed = x.swap_dims(1, 2);
        let wide = Tensor::<NdArray, 3>::from_data(
            TensorData::new(
                (0..10).map(|i| i as f32 - 4.5).collect::<Vec<f32>>(),
                [2, 5, 1],
            ),
            &device,
        );
        let broadcast = (transposed.clone() * wide.clone()).into_data();
        assert_eq!(scale_rows(transposed, wide).into_data(), broadcast);
    }
}
