"""Convert an official ELSA-Swin classification checkpoint (damo-cv/ELSA)
to an mmpretrain ``ImageClassifier`` checkpoint (``ELSASwinTransformer``
backbone with ``out_indices=(3,)``, ``GlobalAveragePooling``,
``LinearClsHead``)."""

import argparse

from mmevo import apis


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help='official checkpoint (path or URL)')
    parser.add_argument('dst', help='where to save the converted one')
    args = parser.parse_args(argv)
    with apis.one_line_errors():
        apis.convert_swin_checkpoint(args.src, args.dst, 'elsa')
    print(f'saved {args.dst}')


if __name__ == '__main__':
    main()
