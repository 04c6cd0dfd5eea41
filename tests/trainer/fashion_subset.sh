# Sourced by the kat_train test scripts (bash).
#
# fashion_subset SRC DEST N_TRAIN N_TEST: writes the first N_TRAIN training and N_TEST test
# images and labels of the Fashion-MNIST files in SRC (raw or .gz) to DEST as raw IDX files
# with their counts set to match, the same bytes kat_train would read from SRC for them.
# kat_train reads the whole training and test sets and evaluates on every test image after
# each epoch, so a test that trains on a few hundred images spends most of its time loading
# 70,000 images and evaluating 10,000 (a CNN run of 4 epochs of 640 images: 12.4 s of which
# 1.4 s training, 2026-11-28); under the sanitizers a kat_train run took 13 s.
fashion_subset() {
  local src=$1 dest=$2 n_train=$3 n_test=$4 split kind n header item file from size
  mkdir -p "$dest" || return 1
  for split in train t10k; do
    n=$n_train
    [ "$split" = train ] || n=$n_test
    for kind in images-idx3 labels-idx1; do
      header=8 item=1
      [ "$kind" = labels-idx1 ] || header=16 item=784
      file=$split-$kind-ubyte
      from=$src/$file
      [ -f "$from" ] || from=$src/$file.gz
      [ -f "$from" ] || { echo "fashion_subset: no $file or $file.gz in $src" >&2; return 1; }
      # head stops reading early: gzip's broken pipe is expected; the size check below is
      # what says the copy is whole.
      { gzip -cdf <"$from" 2>/dev/null || true; } | head -c $((header + n * item)) >"$dest/$file"
      size=$(stat -c %s "$dest/$file")
      [ "$size" -eq $((header + n * item)) ] ||
        { echo "fashion_subset: $from holds fewer than $n items" >&2; return 1; }
      # The count, a big-endian 32-bit integer at byte 4.
      printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $((n >> 24 & 255)) $((n >> 16 & 255)) \
        $((n >> 8 & 255)) $((n & 255)))" | dd of="$dest/$file" bs=1 seek=4 conv=notrunc status=none ||
        return 1
    done
  done
}
