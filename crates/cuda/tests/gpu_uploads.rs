//! Copies to the device through the page-locked staging memory (`upload.rs`): many copies
//! that wrap around both halves, and copies larger than a half, land intact; a copy into a
//! smaller buffer is an error. Skips visibly without a GPU.

mod common;

use rand::{Rng, SeedableRng, rngs::StdRng};
use vortex_cuda::upload::HALF;

#[test]
fn gpu_uploads_land_intact_across_both_halves() {
    let Some(dev) = common::device_or_skip("gpu_uploads_land_intact_across_both_halves") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(common::test_seed());
    let half = HALF / 4;
    // Sizes from one value to more than a half, in bytes about five times the staging memory.
    let mut sizes: Vec<usize> = (0..60).map(|_| rng.random_range(1..half / 2)).collect();
    sizes.extend([half - 1, half, half + 1, 3 * half]);
    let mut copies = Vec::new();
    for &n in &sizes {
        let data: Vec<u32> = (0..n).map(|_| rng.random()).collect();
        let mut buf = dev.stream.alloc_zeros::<u32>(n + 7).unwrap();
        dev.upload(&data, &mut buf.slice_mut(3..3 + n)).unwrap();
        copies.push((data, buf));
    }
    for (i, (data, buf)) in copies.iter().enumerate() {
        let back = dev.stream.clone_dtoh(buf).unwrap();
        assert!(
            back[..3]
                .iter()
                .chain(&back[3 + data.len()..])
                .all(|&x| x == 0)
        );
        assert!(
            back[3..3 + data.len()] == data[..],
            "copy {i} of {} values",
            data.len()
        );
    }
}

#[test]
fn gpu_uploads_refuse_a_smaller_buffer() {
    let Some(dev) = common::device_or_skip("gpu_uploads_refuse_a_smaller_buffer") else {
        return;
    };
    let mut buf = dev.stream.alloc_zeros::<u32>(4).unwrap();
    let err = dev.upload(&[1u32; 5], &mut buf.slice_mut(..)).unwrap_err();
    assert!(err.to_string().contains("5 values into 4"), "{err}");
}
