# Clustered bars, one cluster per case, one bar per method (paper 002
# Fig. 6 and Fig. 8 style). Variables (gnuplot -e): datafile, outfile,
# ncol (columns in datafile), ylab, ttl, [refline: draw y = refline].
# datafile: tab-separated, header "case m1 m2 ...", NaN for missing values.
set terminal pngcairo size 1100,500 font ",11" noenhanced
set output outfile
set title ttl
set ylabel ylab
set xlabel "case"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set key outside right top
set grid ytics
set yrange [0:*]
set datafile missing "NaN"
set datafile separator "\t"
if (exists("refline")) set arrow from graph 0, first refline to graph 1, first refline nohead dt 2 lw 2 lc rgb "black"
plot for [i=2:ncol] datafile using i:xtic(1) title columnhead(i)
