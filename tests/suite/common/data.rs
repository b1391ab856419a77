//! Real data nobody here wrote, shipped inside packages and extracted by
//! `scripts/install-test-services` into `~/.cache/palletd-test/data`.

use super::*;

/// The weekly CO2 readings at Mauna Loa, 1958-2001 (statsmodels'
/// `co2.csv`, from its wheel on PyPI): (date as YYYYMMDD, ppm), the weeks
/// without a reading left out.
pub fn co2() -> Vec<(i64, f64)> {
    let path = data_dir().join("co2.csv");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; {INSTALL_HINT}", path.display()));
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let (date, ppm) = l.split_once(',')?;
            Some((date.parse().ok()?, ppm.parse().ok()?))
        })
        .collect()
}

/// The monthly sea surface temperatures of the El Nino region, 1950-2010
/// (statsmodels' `elnino.csv`), month after month, in degrees C.
pub fn elnino() -> Vec<f64> {
    let text = std::fs::read_to_string(data_dir().join("elnino.csv"))
        .unwrap_or_else(|e| panic!("cannot read elnino.csv: {e}; {INSTALL_HINT}"));
    text.lines()
        .skip(1)
        .flat_map(|l| {
            l.split(',')
                .skip(1)
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<f64>>()
        })
        .collect()
}

fn data_dir() -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    std::env::var_os("PALLETD_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cache/palletd-test/data"))
}
