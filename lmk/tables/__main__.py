from lmk.experiments.tables import main

main()
